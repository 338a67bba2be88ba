"""Bad input and hostile conditions: one line on stderr, exit 2, nothing written or lost."""

import pytest

from bamctl.checkpoint import new_random_model, save_checkpoint
from bamctl.cli import main
from bamctl import devices
from bamctl.engine import memory
from bamctl.model import ModelConfig
from bamctl.results.store import ResultStore


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "rope"
    return str(save_checkpoint(new_random_model(ModelConfig.from_preset("micro", "rope", train_length=128), 0), path))


def cli(capsys, *args):
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    return exit_info.value.code, capsys.readouterr().err


def test_length_that_cannot_fit_is_refused_before_any_work(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(devices, "available_bytes", lambda device: 200 * 2**20)  # a 200 MiB machine
    code, err = cli(capsys, "passkey", model_dir, "--lengths", "512k", "--dir", str(tmp_path))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "GiB" in lines[0] and "tokens fit" in lines[0]
    assert ResultStore(tmp_path).part_files() == []


def test_estimate_grows_linearly_with_context():
    config = ModelConfig.from_preset("tiny", "bam-ssmax")
    import torch

    sizes = [memory.estimate_bytes(config, n, 2048, torch.float32, "blockwise") for n in (32_768, 65_536, 131_072)]
    assert sizes[2] - sizes[1] == pytest.approx(2 * (sizes[1] - sizes[0]), rel=1e-6)
    dense = memory.estimate_bytes(config, 131_072, 2048, torch.float32, "dense")
    assert dense > 2 * sizes[2]  # dense attention holds a chunk x n logits block


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--lengths", "1k..banana"], "length"),
        (["--lengths", "0"], "length"),
        (["--depths", "1.5"], "depth"),
        (["--depths", "x"], "depth"),
        (["--shard", "2/2"], "--shard"),
        (["--seed", "a"], "--seed"),
        (["--protocol", "nonsense"], "nonsense"),
        (["--device", "tpu"], "device"),
        (["--attention", "magic"], "attention"),
        (["--chunk-size", "0"], "chunk"),
    ],
)
def test_malformed_options_are_one_line(model_dir, tmp_path, capsys, args, fragment):
    code, err = cli(capsys, "passkey", model_dir, "--dir", str(tmp_path), *args)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in err


def test_unknown_model_and_task_suggest_close_matches(model_dir, tmp_path, capsys):
    code, err = cli(capsys, "compare", model_dir, "--task", "pasky", "--dir", str(tmp_path))
    assert code == 2 and "did you mean" in err and "passkey" in err
    code, err = cli(capsys, "passkey", "hf-model-that-is-not-here", "--dir", str(tmp_path))
    assert code == 2 and "unknown model" in err


def test_corrupt_checkpoint_is_refused(model_dir, tmp_path, capsys):
    import shutil
    from pathlib import Path

    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    weights = Path(broken) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF
    weights.write_bytes(bytes(data))
    code, err = cli(capsys, "passkey", str(broken), "--dir", str(tmp_path / "r"))
    assert code == 2 and "corrupt" in err


def test_unwritable_out_is_refused_up_front(model_dir, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code, err = cli(capsys, "passkey", model_dir, "--dir", str(blocker / "results"))
    assert code == 2 and "cannot write results" in err


def test_two_processes_racing_on_the_same_samples_lose_and_double_nothing(model_dir, tmp_path):
    import subprocess
    import sys

    def start():
        cmd = [sys.executable, "-m", "bamctl", "passkey", model_dir, "--lengths", "128,256", "--samples", "2",
               "--seed", "0", "--dir", str(tmp_path), "--quiet"]
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    first, second = start(), start()  # the same keys: both may compute a sample before seeing the other's row
    assert first.wait(timeout=300) == 0, first.stderr.read()
    assert second.wait(timeout=300) == 0, second.stderr.read()
    keys = ["seed", "length", "depth", "sample"]
    stored = ResultStore(tmp_path).read(dedupe=False)
    frame = ResultStore(tmp_path).read()
    assert len(frame) == 2 * 5 * 2 and not frame.duplicated(keys).any()  # lengths x depths x samples, once each
    assert stored.groupby(keys).size().max() <= 2  # at most one copy per racing process
    assert (stored.groupby(keys)["predicted"].nunique() == 1).all()  # and the copies agree


def test_foreign_and_truncated_parquet_files_are_reported_and_skipped(model_dir, tmp_path, capsys):
    assert cli(capsys, "passkey", model_dir, "--lengths", "128", "--samples", "1", "--dir", str(tmp_path), "--quiet")[0] == 0
    good = ResultStore(tmp_path).part_files()[0]
    (tmp_path / "part-0-truncated.parquet").write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    import pandas as pd

    pd.DataFrame({"x": [1, 2]}).to_parquet(tmp_path / "foreign.parquet")
    code, err = cli(capsys, "results", "show", "--dir", str(tmp_path))
    assert code == 0
    assert "truncated" in err and "foreign.parquet" in err
    assert len(ResultStore(tmp_path).read()) == 5
