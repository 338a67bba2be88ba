"""The sweep manifest fingerprints the protocol each model runs, resolved with its own tokenizer."""

import shutil

import pytest

from bamctl.checkpoint import new_random_model, save_checkpoint
from bamctl.cli import main
from bamctl.cli.submit_commands import plan_sweep
from bamctl.cluster import sweep
from bamctl.model import ModelConfig
from bamctl.results.store import ResultStore
from bamctl.tasks import registry

SWEEP = ["--lengths", "128", "--samples", "1", "--depths", "0.5", "--device", "cpu"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    config = ModelConfig.from_preset("micro", "rope", train_length=128)  # GPT-2's tokenizer: auto runs `exact`
    return str(save_checkpoint(new_random_model(config, 0), tmp_path_factory.mktemp("models") / "rope"))


def run_cli(*args):
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    return exit_info.value.code


@pytest.fixture
def edited_exact_protocol(tmp_path, monkeypatch):
    """The task tables with passkey's `exact` protocol changed (its filler joined by two spaces)."""
    folder = tmp_path / "tasks"
    shutil.copytree(registry.tasks_dir(), folder)
    toml = folder / "passkey.toml"
    text = toml.read_text()
    assert 'form = "exact_length", join = " "' in text
    toml.write_text(text.replace('form = "exact_length", join = " "', 'form = "exact_length", join = "  "', 1))

    def edit():
        monkeypatch.setattr(registry, "tasks_dir", lambda: folder)
        registry._load.cache_clear()

    yield edit
    registry._load.cache_clear()


def test_the_manifest_holds_the_fingerprint_of_the_protocol_the_model_runs(model, tmp_path):
    out = tmp_path / "results"
    description, _, _ = plan_sweep(["passkey", model, *SWEEP, "--dir", str(out)])
    (plans,) = [request["plans"][model] for request in description["requests"]]
    assert list(plans) == ["exact"]
    assert run_cli("passkey", model, *SWEEP, "--quiet", "--dir", out) == 0
    from bamctl.backends import RunOptions, open_backend
    from bamctl.fingerprints import digest

    feeding = open_backend(model, RunOptions(device="cpu")).feeding  # a row's fingerprint is the plan's and the feeding's
    assert set(ResultStore(out).read()["fingerprint"]) == {digest([plans["exact"], feeding])}


def test_an_edit_of_the_protocol_a_model_runs_is_refused_on_the_node(model, tmp_path, capsys, edited_exact_protocol):
    out = tmp_path / "results"
    command = ["passkey", model, *SWEEP, "--dir", str(out)]
    description, planned_out, _ = plan_sweep(command)
    record = sweep.claim(planned_out, description)  # as `bamctl submit` records it
    edited_exact_protocol()  # the checkout changes between submit and run
    with sweep.expecting(record.id):
        assert run_cli(*command, "--quiet", "--shard", "0/2") == 2
    err = capsys.readouterr().err
    assert "another sweep than the one submitted" in err and "exact" in err
    assert ResultStore(out).part_files() == []


def test_a_model_whose_tokenizer_is_unknown_before_loading_fingerprints_every_protocol_auto_may_pick():
    from types import SimpleNamespace

    from bamctl.runs.plans import model_plans
    from bamctl.evaluation import TaskRequest

    request = TaskRequest(task="passkey", lengths=[128], samples=1, seeds=[0], depths=[0.5])
    (per_model,) = model_plans([request], [SimpleNamespace(tokenizer=None)])
    assert list(per_model[0]) == ["authors", "exact"]
    assert len(set(per_model[0].values())) == 2
