"""`bamctl submit --executor slurm` against a real one-node Slurm (scripts/slurm/start.sh).

Marked `slurm`: left out of the default suite, run with `pytest -m slurm` (as .ci/run does),
as root where slurm-wlm is installed; elsewhere each test skips and says what is missing.
The sweep is the local-executor tests' (two micro models, a dozen rows); each job's cost is
its process start on a busy 2-core machine.
"""

import io
from contextlib import redirect_stdout

import pytest

from bamctl.checkpoint import new_random_model, save_checkpoint
from bamctl.cli import main
from bamctl.model import ModelConfig
from bamctl.results.store import ResultStore
from slurm_cluster import SlurmManager, why_not

pytest.importorskip("submitit", reason="bamctl submit needs the cluster extra (pip install 'bamctl[cluster]')")
pytestmark = pytest.mark.slurm

VOLATILE = ["run_id", "created_at", "seconds", "tokens_per_s", "peak_mem_bytes", "git_revision"]
KEYS = ["model", "task", "protocol", "setting", "length", "depth", "seed", "sample", "position"]
SWEEP = ["--task", "passkey", "--lengths", "128", "--samples", "2", "--depths", "0,0.5,1", "--device", "cpu"]
ROWS = 2 * 3 * 2  # models x depths x samples
ONE_CORE = ["--cpus-per-shard", "1"]  # two shards run at once on a 2-core node


@pytest.fixture(scope="module", autouse=True)
def slurm_can_start():
    """Skip before the module's costly fixtures where no Slurm can be started here."""
    reason = why_not(accounting=False)
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def slurms():
    manager = SlurmManager()
    yield manager
    manager.stop()


@pytest.fixture
def slurm(slurms, monkeypatch):
    """A Slurm without accounting (sacct fails), as many small clusters run."""
    cluster = slurms.get(accounting=False)
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    return cluster


@pytest.fixture
def slurm_with_accounting(slurms, monkeypatch):
    cluster = slurms.get(accounting=True)
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    return cluster


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return [str(save_checkpoint(new_random_model(ModelConfig.from_preset("micro", pe, train_length=128), seed), root / pe))
            for pe, seed in (("bam-ssmax", 0), ("rope", 1))]


def run_cli(*args):
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    return exit_info.value.code


def stable(frame):
    return frame.drop(columns=VOLATILE).sort_values(KEYS).reset_index(drop=True)


@pytest.fixture(scope="module")
def one_process(models, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "results"
    printed = io.StringIO()
    with redirect_stdout(printed):
        assert run_cli("compare", *models, *SWEEP, "--quiet", "--out", out) == 0
    return ResultStore(out).read(), printed.getvalue()


def _compare(models, out):
    return ["compare", *models, *SWEEP, "--out", str(out)]


def _raw(out):
    return ResultStore(out).read_table(dedupe=False).to_pandas()


def test_slurm_shards_give_exactly_the_rows_and_the_table_of_one_process(slurm, models, one_process, tmp_path, capsys):
    out = tmp_path / "results"
    assert run_cli("submit", "--shards", 2, "--executor", "slurm", *ONE_CORE, "--", *_compare(models, out)) == 0
    captured = capsys.readouterr()
    rows, table = one_process
    assert stable(ResultStore(out).read()).equals(stable(rows))
    assert len(_raw(out)) == ROWS  # nothing doubled
    assert captured.out == table
    assert "shards: 2 done" in captured.err


@pytest.mark.parametrize("array, expected", [("1-2", {"1": "0/2", "2": "1/2"}),
                                             ("0-2:2", {"0": "0/2", "2": "1/2"})])
def test_shard_auto_in_an_offset_or_stepped_array(slurm, tmp_path, array, expected):
    """What Slurm itself sets in an array's tasks, read by --shard auto: one shard per task, none outside."""
    import sys
    import time

    probe = (f"{sys.executable} -c 'import os; from bamctl.cluster.shards import shard_from_environment as s; "
             "(i, n), _ = s(os.environ); print(f\"{i}/{n}\")'")
    slurm.run("sbatch", f"--array={array}", "--cpus-per-task=1", f"--output={tmp_path}/%a.out", "--wrap", probe)
    for _ in range(120):
        outputs = {p.stem: p.read_text().strip() for p in tmp_path.glob("*.out")}
        if len(outputs) == len(expected) and all(outputs.values()):
            break
        time.sleep(0.5)
    assert outputs == expected
