"""The GPU run's plumbing on the CPU (default suite): bench/gpu_bench.py's phases at tiny size, and
scripts/gpu_run.sh's timeouts and summary. The CUDA checks themselves are tests/test_cuda.py."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gpu_bench():
    spec = importlib.util.spec_from_file_location("gpu_bench", REPO / "bench" / "gpu_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_forward_flops_are_torchs_count_less_what_the_engine_skips(gpu_bench):
    from torch.utils.flop_counter import FlopCounterMode

    from bamctl.checkpoint import new_random_model
    from bamctl.model import ModelConfig

    config = ModelConfig.from_preset("micro", "bam-ssmax")
    model = new_random_model(config, seed=0)
    n = 96
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.zeros(1, n, dtype=torch.long))
    # The dense forward computes every (query, key) pair and the head on every row; the floor
    # counts the causal half of the two attention products and leaves the head (a few rows) out.
    skipped = config.n_layers * 2 * n * n * config.dim + 2 * n * config.vocab_size * config.dim
    assert gpu_bench.forward_flops(model, n) == counter.get_total_flops() - skipped


def test_passkey_phase_writes_its_table_with_the_floor(gpu_bench, tmp_path):
    code = gpu_bench.main([
        "passkey", "--out", str(tmp_path), "--device", "cpu", "--preset", "micro", "--lengths", "256",
        "--chunk-size", "128", "--matmul-size", "64", "--repeats", "1", "--attention", "blockwise",
    ])
    assert code == 0
    table = json.loads((tmp_path / "passkey.json").read_text())
    (row,) = table["rows"]
    assert row["length"] == 256 and row["cold s"] > 0 and row["warm s"] > 0
    assert row["warm / floor"] == pytest.approx(row["warm s"] / row["floor s"])
    assert "blockwise attention" in table["title"] and "TFLOP/s" in table["title"]
    assert "| 256 |" in (tmp_path / "passkey.md").read_text()


def test_batches_phase_runs_one_request_per_call_and_auto_on_the_same_prompts(gpu_bench, tmp_path):
    code = gpu_bench.main([
        "batches", "--out", str(tmp_path), "--device", "cpu", "--preset", "micro", "--lengths", "256",
        "--prompts", "3", "--chunk-size", "128", "--attention", "blockwise",
    ])
    assert code == 0
    (row,) = json.loads((tmp_path / "batches.json").read_text())["rows"]
    assert row["length"] == 256 and row["auto batch"] > 1
    assert row["same answers"] == "3/3"  # a batch answers as its prompts do alone
    assert row["auto / B=1"] == pytest.approx(row["auto tok/s"] / row["B=1 tok/s"])


def test_tests_phase_reads_the_junit_report(gpu_bench, tmp_path):
    junit = tmp_path / "report.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_cuda" name="test_a" time="1.5"/>'
        '<testcase classname="tests.test_cuda" name="test_b" time="0.2"><failure message="AssertionError: off by 2e-5&#10;more">tb</failure></testcase>'
        '<testcase classname="tests.test_cuda" name="test_c" time="0"><skipped message="needs a CUDA GPU"/></testcase>'
        "</testsuite></testsuites>"
    )
    assert gpu_bench.main(["tests", "--out", str(tmp_path), "--junit", str(junit)]) == 0
    rows = json.loads((tmp_path / "cuda-tests.json").read_text())["rows"]
    assert [(r["test"], r["outcome"], r["message"]) for r in rows] == [
        ("test_a", "passed", ""), ("test_b", "FAILED", "AssertionError: off by 2e-5"), ("test_c", "skipped", "needs a CUDA GPU"),
    ]
    assert gpu_bench.main(["tests", "--out", str(tmp_path), "--junit", str(tmp_path / "absent.xml")]) == 1


def test_deps_names_what_is_missing_and_never_torch(gpu_bench, monkeypatch):
    import importlib.metadata

    real = importlib.metadata.version

    def version(name):
        if name in ("tiktoken", "torch"):
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert gpu_bench.missing_requirements() == ["tiktoken>=0.7"]


def test_run_script_times_each_phase_out_and_still_writes_the_summary(tmp_path):
    limits = {f"TIMEOUT_{phase}": "0.2" for phase in ("INSTALL", "TESTS", "ATTENTION", "PASSKEY", "BATCHES")}
    env = {**os.environ, **limits, "PYTHON": sys.executable}
    done = subprocess.run(["bash", "scripts/gpu_run.sh", str(tmp_path), "--dry-run"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    rows = [line.split("|")[1:-1] for line in (tmp_path / "summary.md").read_text().splitlines()[2:]]
    assert [(name.strip(), rc.strip(), status.strip()) for name, rc, _, status in rows] == [
        (phase, "124", "timed out") for phase in ("install", "cuda-tests", "attention", "passkey", "batches")
    ]
    assert done.returncode == 1, done.stdout  # any phase short of ok fails the run
    assert all((tmp_path / f"{phase}.log").is_file() for phase in ("install", "cuda-tests", "attention", "passkey", "batches"))


def test_gpu_check_prints_its_results_with_a_real_command(tmp_path, capsys):
    import shlex

    from bamctl.cli import main
    from bamctl.results.store import ResultStore
    from results_fakes import passkey_grid

    ResultStore(tmp_path / "results").append(passkey_grid())
    script = (REPO / "scripts" / "gpu_check.sh").read_text()
    calls = [line.split("||")[0] for line in script.splitlines() if line.strip().startswith("bamctl results")]
    assert calls, "gpu_check.sh prints no results table"
    for call in calls:
        argv = shlex.split(call.replace('"$OUT/results"', str(tmp_path / "results")))[1:]
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 0, f"{call.strip()}: {capsys.readouterr().err.strip()}"
        assert "passkey" in capsys.readouterr().out
