"""Never a silently wrong number: nonsense refused before any work, nothing overwritten unasked,
results directories any Parquet reader opens, the fast kernels' range enforced."""

from __future__ import annotations

import json

import pytest
import torch

from bamctl.checkpoint import load_checkpoint, new_random_model, save_checkpoint
from bamctl.cli import main
from bamctl.engine import stream
from bamctl.errors import BamctlError
from bamctl.model import ModelConfig


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("integrity")
    return str(save_checkpoint(new_random_model(ModelConfig.from_preset("micro", "bam-ssmax", train_length=128), 0), root / "m"))


def cli(capsys, *args):
    with pytest.raises(SystemExit) as done:
        main(list(args))
    captured = capsys.readouterr()
    return done.value.code, captured.out, captured.err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("args, named", [
    (["--samples", "0"], "--samples"),
    (["--samples", "-3"], "--samples"),
    (["--chunk-size", "0"], "--chunk-size"),
    (["--chat-template"], "--chat-template"),
    (["--tensor-parallel", "2"], "--tensor-parallel"),
    (["--beyond-max", "refuse"], "--beyond-max"),
    (["--tokenizer", "gpt2"], "--tokenizer"),
    (["--lengths", "0"], "length"),
])
def test_nonsense_is_one_line_and_exit_2_before_any_work(model_dir, tmp_path, capsys, args, named):
    code, _, err = cli(capsys, "passkey", model_dir, "--dir", str(tmp_path), "--quiet", *args)
    assert code == 2 and named in one_line(err)
    assert not list(tmp_path.glob("*.parquet"))


@pytest.fixture
def no_model_opened(monkeypatch):
    """Fails a test whose command opens a model: its checks must come before any is loaded."""
    import bamctl.backends

    def refuse(*args, **kwargs):
        raise AssertionError("a model was opened before the run's checks ended")

    monkeypatch.setattr(bamctl.backends, "open_backend", refuse)


def test_a_second_task_too_short_for_a_length_stops_the_run_before_any_model_loads(model_dir, tmp_path, capsys, no_model_opened):
    # niah_single_1 fits 256 tokens, niah_multikey_1 does not: once the first task's samples were stored first.
    code, _, err = cli(capsys, "ruler", model_dir, "--task", "niah_single_1,niah_multikey_1", "--lengths", "256,512",
                       "--samples", "1", "--dir", str(tmp_path / "r"), "--quiet")
    line = one_line(err)
    assert code == 2 and "length 256 is too short for niah_multikey_1" in line and "start --lengths at 512" in line
    assert not list(tmp_path.rglob("*.parquet"))


def test_default_lengths_start_where_the_task_builds_and_say_so(model_dir, tmp_path, capsys):
    # 1x of a 128-token model is too short for RULER's template: the defaults begin at 256, and say so.
    code, _, err = cli(capsys, "ruler", model_dir, "--task", "niah_single_1", "--samples", "1",
                       "--dir", str(tmp_path / "r"), "--quiet")
    assert code == 0, err
    assert "niah_single_1: the default lengths start at 256" in err
    from bamctl.results.store import ResultStore

    lengths = sorted(set(ResultStore(tmp_path / "r").read()["length"]))
    assert lengths[0] == 256 and lengths[-1] == 128 * 64  # the rest of the defaults, up to 64x


def test_asked_lengths_too_short_for_a_task_are_refused_with_the_lengths_that_fit(model_dir, tmp_path, capsys, no_model_opened):
    code, _, err = cli(capsys, "ruler", model_dir, "--task", "niah_single_1", "--lengths", "128,256",
                       "--dir", str(tmp_path / "r"), "--quiet")
    assert code == 2 and "length 128 is too short for niah_single_1" in err and "start --lengths at 256" in err
    assert len([line for line in err.strip().splitlines() if line.startswith("error")]) == 1
    assert not list(tmp_path.rglob("*.parquet"))


def test_a_zero_stride_is_refused_not_run_as_the_window(model_dir, tmp_path, capsys):
    code, _, err = cli(capsys, "ppl", model_dir, "--lengths", "256", "--stride", "0", "--dir", str(tmp_path), "--quiet")
    assert code == 2 and "--stride" in one_line(err)


def test_a_stride_longer_than_a_window_is_refused_before_any_work(model_dir, tmp_path, capsys):
    code, _, err = cli(capsys, "ppl", model_dir, "--lengths", "128,256", "--stride", "200", "--dir", str(tmp_path), "--quiet")
    assert code == 2 and "stride" in one_line(err) and not list(tmp_path.glob("*.parquet"))


def test_compare_checks_every_model_before_loading_any(model_dir, tmp_path, capsys, monkeypatch):
    opened = []
    import bamctl.backends as backends

    real = backends.BackendEntry.open
    monkeypatch.setattr(backends.BackendEntry, "open", lambda self, *a: opened.append(a) or real(self, *a))
    code, _, err = cli(capsys, "compare", model_dir, "no-such-model", "--lengths", "128", "--dir", str(tmp_path), "--quiet")
    assert code == 2 and "no-such-model" in one_line(err) and opened == []


def test_compare_holds_one_model_at_a_time(model_dir, tmp_path, capsys, monkeypatch):
    import gc
    import weakref

    import bamctl.backends as backends

    alive = []
    real = backends.BackendEntry.open

    def tracking(self, *args):
        backend = real(self, *args)
        gc.collect()
        assert all(ref() is None for ref in alive), "the previous model is still held"
        alive.append(weakref.ref(backend))
        return backend

    monkeypatch.setattr(backends.BackendEntry, "open", tracking)
    code, _, err = cli(capsys, "compare", model_dir, model_dir + "/", "--lengths", "128", "--samples", "1", "--dir", str(tmp_path / "r"), "--quiet")
    assert code == 0, err
    assert len(alive) == 2  # both models were opened, one after the other


def test_a_renamed_checkpoint_finds_its_rows_under_its_new_name(model_dir, tmp_path, capsys):
    import json
    import shutil

    out = str(tmp_path / "r")
    args = ["--lengths", "128", "--samples", "1", "--dir", out, "--json"]
    code, first, err = cli(capsys, "compare", model_dir, *args)
    assert code == 0, err
    renamed = shutil.copytree(model_dir, tmp_path / "renamed")  # same weights, another folder name
    code, again, err = cli(capsys, "compare", str(renamed), *args)
    assert code == 0 and "skipped" in err, err
    (before,), (after,) = json.loads(first)["summaries"], json.loads(again)["summaries"]
    assert after["models"] == ["renamed"] and after["cells"]
    assert [c["score"] for c in after["cells"]] == [c["score"] for c in before["cells"]]


def test_without_lengths_the_plan_is_said_before_the_run(model_dir, tmp_path, capsys):
    code, _, err = cli(capsys, "passkey", model_dir, "--shard", "0/1000", "--dir", str(tmp_path))
    assert code == 0
    assert "planning 7 lengths, 128 to 8k" in err and "140 samples" in err
    code, _, err = cli(capsys, "passkey", model_dir, "--shard", "0/1000", "--dir", str(tmp_path), "--quiet")
    assert code == 0 and "planning" not in err  # --quiet: the plan as the defaults make it is no news


def test_new_refuses_to_overwrite_a_checkpoint_without_force(tmp_path, capsys):
    out = tmp_path / "ckpt"
    assert cli(capsys, "new", "--out", str(out), "--preset", "micro", "--seed", "1")[0] == 0
    before = (out / "model.safetensors").read_bytes()
    code, _, err = cli(capsys, "new", "--out", str(out), "--preset", "micro", "--seed", "2")
    assert code == 2 and "--force" in one_line(err)
    assert (out / "model.safetensors").read_bytes() == before
    assert cli(capsys, "new", "--out", str(out), "--preset", "micro", "--seed", "2", "--force")[0] == 0
    assert (out / "model.safetensors").read_bytes() != before


def test_auto_says_once_when_the_native_kernel_cannot_be_built(monkeypatch, capsys):
    monkeypatch.setattr(stream, "native_available", lambda: (False, "no C++ compiler here"))
    stream._notice.cache_clear()
    try:
        for _ in range(3):
            assert stream.resolve_attention("auto", torch.device("cpu")) in ("fused", "blockwise")
        err = capsys.readouterr().err
        assert err.count("no C++ compiler here") == 1 and "fused" in err
    finally:
        stream._notice.cache_clear()


def test_a_negative_ssmax_scale_over_a_prior_never_runs_on_a_folding_kernel(model_dir, monkeypatch, capsys):
    model = load_checkpoint(model_dir).model
    with torch.no_grad():
        model.layers[1].attention.ssmax_scale[2] = -0.5
    for path in stream.FOLDING_PATHS:
        with pytest.raises(BamctlError, match="negative SSMax scale"):
            stream.StreamingEngine(model, device="cpu", attention=path)
    ids = torch.randint(0, model.config.vocab_size, (300,), generator=torch.Generator().manual_seed(0)).tolist()
    reference = model(torch.tensor([ids]))[0]
    stream._notice.cache_clear()
    if stream.native_available()[0]:  # auto's choice on a CPU forms (score + prior) * factor itself: exact
        engine = stream.StreamingEngine(model, device="cpu", attention="auto", chunk_size=50)
        assert engine.attention == "native" and "note:" not in capsys.readouterr().err
        assert torch.allclose(engine.logits_at(ids, list(range(300))), reference, atol=1e-4)
    monkeypatch.setattr(stream, "native_available", lambda: (False, "no C++ compiler here"))
    engine = stream.StreamingEngine(model, device="cpu", attention="auto", chunk_size=50)  # would fall back to fused
    assert engine.attention == "blockwise" and "negative SSMax" in capsys.readouterr().err
    assert torch.allclose(engine.logits_at(ids, list(range(300))), reference, atol=1e-4)
    stream._notice.cache_clear()


def test_a_results_directory_is_a_plain_parquet_dataset(model_dir, tmp_path, capsys):
    import duckdb
    import pandas as pd
    import polars as pl
    import pyarrow.dataset as ds

    out = tmp_path / "results"
    code, _, err = cli(capsys, "compare", model_dir, "--lengths", "128,256", "--samples", "1", "--dir", str(out), "--quiet")
    assert code == 0, err
    assert (tmp_path / "results-passkey.png").read_bytes()[:4] == b"\x89PNG"  # the plot is beside it
    assert {p.suffix for p in out.iterdir() if not p.name.startswith((".", "_"))} == {".parquet"}
    rows = 2 * 5
    assert len(pd.read_parquet(out)) == rows
    assert ds.dataset(out).to_table().num_rows == rows
    assert duckdb.sql(f"SELECT count(*) FROM '{out}/*.parquet'").fetchall() == [(rows,)]
    assert pl.read_parquet(out).height == rows


def test_a_plot_inside_the_results_directory_is_refused(model_dir, tmp_path, capsys):
    code, _, err = cli(capsys, "compare", model_dir, "--lengths", "128", "--dir", str(tmp_path), "--plot", str(tmp_path / "p.png"), "--quiet")
    assert code == 2 and "inside the results directory" in one_line(err)


def _row_keys(frame) -> list:
    return sorted(zip(frame["model_hash"], frame["task"], frame["length"], frame["depth"], frame["seed"], frame["sample"]))


def test_the_main_jobs_layout_leaves_results_a_dataset_of_exactly_its_rows(model_dir, tmp_path, capsys, monkeypatch):
    # scripts/main.sh writes two runs into results/main and a plot of each; reading results/ whole
    # must give the stored rows, no more, no fewer, with no image in the way.
    import pandas as pd
    import pyarrow.dataset as ds

    from bamctl.results.store import ResultStore

    monkeypatch.chdir(tmp_path)
    code, _, err = cli(capsys, "compare", model_dir, "--lengths", "128", "--samples", "1", "--dir", "results/main",
                       "--plot", "plots/main-passkey.png", "--quiet")
    assert code == 0, err
    code, _, err = cli(capsys, "compare", model_dir, "--lengths", "128,256", "--samples", "1", "--dir", "results/main", "--quiet")
    assert code == 0, err
    assert (tmp_path / "plots" / "main-passkey.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "results-main-passkey.png").read_bytes()[:4] == b"\x89PNG"  # the default: beside results/
    data = [p for p in (tmp_path / "results").rglob("*") if p.is_file() and not p.name.startswith((".", "_"))]
    assert data and {p.suffix for p in data} == {".parquet"}

    stored = _row_keys(ResultStore(tmp_path / "results" / "main").read())
    assert len(stored) == 2 * 5  # two lengths x five depths: the first run's rows reused, not doubled
    assert _row_keys(pd.read_parquet("results")) == stored
    assert _row_keys(ds.dataset("results").to_table().to_pandas()) == stored
    duckdb = pytest.importorskip("duckdb", reason="duckdb is not installed")
    assert _row_keys(duckdb.sql("SELECT * FROM 'results/**/*.parquet'").df()) == stored
    polars = pytest.importorskip("polars", reason="polars is not installed")
    assert _row_keys(polars.read_parquet("results/**/*.parquet").to_pandas()) == stored


def test_a_plot_inside_the_folder_holding_the_results_is_refused(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(capsys, "compare", model_dir, "--lengths", "128", "--dir", "results/main",
                       "--plot", "results/main-passkey.png", "--quiet")
    assert code == 2 and "results, which holds the results directory results/main" in one_line(err)
    assert not (tmp_path / "results").exists()  # refused before any work


def test_the_main_job_writes_its_plots_outside_its_results():
    import re
    from pathlib import Path

    from bamctl.cli.plot_paths import plot_path

    repo = Path(__file__).resolve().parents[1]
    script = (repo / "scripts" / "main.sh").read_text()
    pairs = re.findall(r"--dir (\S+) --plot (\S+)", script)
    assert len(pairs) == 2
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(repo)
        for out, plot in pairs:
            assert plot_path(Path(out), Path(plot), "passkey") == Path(plot)


def test_json_of_a_compare_is_one_document(model_dir, tmp_path, capsys):
    code, out, _ = cli(capsys, "compare", model_dir, "--lengths", "128", "--samples", "1", "--dir", str(tmp_path / "r"), "--quiet", "--json")
    assert code == 0 and json.loads(out)["summaries"][0]["fingerprint"]


@pytest.mark.parametrize("command, flagship, options", [("passkey", "bam-ssmax", ["--depths", "1"]), ("ppl", "lm-bam", [])])
def test_a_run_without_a_model_evaluates_the_flagship_and_names_it(tmp_path, capsys, command, flagship, options):
    code, _, err = cli(capsys, command, "--lengths", "256", "--samples", "1", *options, "--dir", str(tmp_path / "r"), "--quiet")
    assert code == 0, err
    assert f"no model named: evaluating the shipped reference {flagship}" in err
    from bamctl.results.store import ResultStore

    assert set(ResultStore(tmp_path / "r").read()["model"]) == {flagship}


def test_a_row_a_server_read_at_another_length_is_asked_again_on_rerun(model_dir, tmp_path, capsys):
    """Such a row holds no score (bamctl.backends.served): a rerun asks its request again rather than
    keep it, and says so; the other rows are reused as usual."""
    from datetime import timedelta

    from bamctl.results.store import ResultStore

    out = tmp_path / "r"
    args = ["passkey", model_dir, "--lengths", "128", "--samples", "2", "--depths", "0.5", "--dir", str(out)]
    code, _, err = cli(capsys, *args)
    assert code == 0, err
    store = ResultStore(out)
    scored = store.read_table().to_pylist()
    first = min(scored, key=lambda row: row["sample"])
    misread = {**first, "served_token_gap": 1, "score": 0.0, "predicted": "", "correct": False,
               "created_at": first["created_at"] + timedelta(microseconds=1)}
    store.append([misread])
    code, _, err = cli(capsys, *args)
    assert code == 0, err
    assert "1 sample stored in" in err and "unscored (a server read the prompt at another length than sent) asked again" in err
    assert "1 sample already in" in err  # the other one, reused
    again = {row["sample"]: row for row in store.read_table().to_pylist()}
    assert again[first["sample"]]["served_token_gap"] is None
    assert again[first["sample"]]["score"] == first["score"] and again[first["sample"]]["predicted"] == first["predicted"]
