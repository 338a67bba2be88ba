"""`bamctl submit --executor slurm` against a real one-node Slurm (scripts/slurm/start.sh).

Marked `slurm`: left out of the default suite, run with `pytest -m slurm` (as .ci/run does),
as root where slurm-wlm is installed; elsewhere each test skips and says what is missing.
The sweep is the local-executor tests' (two micro models, a dozen rows); each job's cost is
its process start on a busy 2-core machine.
"""

import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import pytest

from bamctl.cluster import sweep
from bamctl.cluster.submit import JobSettings
from bamctl.results.store import ResultStore
import cluster_sweep
from cluster_sweep import KEYS, ROWS, compare_command as _compare, models, one_process, run_cli, stable  # noqa: F401 - fixtures
from cluster_sweep import shard_slow_to_start
from slurm_cluster import SlurmManager, why_not

pytest.importorskip("submitit", reason="bamctl submit needs the cluster extra (pip install 'bamctl[cluster]')")
pytestmark = pytest.mark.slurm

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


def _raw(out):
    return ResultStore(out).read_table(dedupe=False).to_pandas()


def _jobs(out, count=2):
    (record,) = sweep.records(out)
    return record.recorded_jobs(count)


def _queued(slurm, job_ids):
    listed = slurm.run("squeue", "--noheader", "--array", "--format", "%i").stdout.split()
    return [job for job in job_ids if job in listed]


@contextmanager
def hang_guard(seconds):
    """Fail instead of waiting forever where a sweep's end is never noticed (the bug this guards)."""
    def fail(*_):
        raise RuntimeError(f"no end of the sweep seen within {seconds} s")

    previous = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _assert_the_whole_sweep(out, one_process, printed):
    rows, table = one_process
    assert stable(ResultStore(out).read()).equals(stable(rows))
    raw = _raw(out)  # as pandas.read_parquet gives it: no key twice
    assert len(raw) == ROWS and not raw.duplicated(subset=KEYS).any()
    assert printed == table


def test_slurm_shards_give_exactly_the_rows_and_the_table_of_one_process(slurm, models, one_process, tmp_path, capsys):
    out = tmp_path / "results"
    assert run_cli("submit", "--shards", 2, "--executor", "slurm", *ONE_CORE, "--", *_compare(models, out)) == 0
    captured = capsys.readouterr()
    _assert_the_whole_sweep(out, one_process, captured.out)
    assert "shards: 2 done" in captured.err
    jobs = _jobs(out)
    for index, entry in jobs.items():  # each job's id and log said at submit
        assert f"shard {index}/2: job {entry['job']}, log {entry['log']}" in captured.err
    logs = list((tmp_path / "results-shards").glob("*_log.*"))
    assert len(logs) == 2 * 2  # the shards' jobs and no other: the table is printed here
    assert not any("accuracy" in log.read_text() for log in logs)
    assert run_cli("submit", "--status", out) == 0
    status = capsys.readouterr().out
    assert status.count("done") >= 2 and all(entry["job"] in status for entry in jobs.values())


def _interrupt_when_running(line):
    if ", 0 running" not in line:
        raise KeyboardInterrupt  # the user's Ctrl-C while shards run


def test_ctrl_c_cancels_the_jobs_or_leaves_them_for_a_rerun_to_attach_to(slurm, models, one_process, tmp_path, capsys):
    import cloudpickle

    from bamctl.cli.submit_commands import EXIT_INTERRUPTED, run_sweep

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the jobs cannot import this test module
    cloudpickle.register_pickle_by_value(cluster_sweep)  # nor the helpers beside it
    out = tmp_path / "results"
    settings = JobSettings(executor="slurm", logs=tmp_path / "logs", cpus=1, minutes=10)
    assert run_sweep(_compare(models, out), 2, settings, shard_job=shard_slow_to_start, show=_interrupt_when_running,
                     queue_poll_s=1) == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    first = [entry["job"] for entry in _jobs(out).values()]
    assert "interrupted: cancelling 2 jobs" in err and all(job in err for job in first)
    assert _queued(slurm, first) == []  # gone before submit returned: none can write a row after it

    # Ctrl-C with --keep-jobs: the jobs go on; the rerun waits for them instead of submitting copies
    assert run_sweep(_compare(models, out), 2, settings, shard_job=shard_slow_to_start, keep_jobs=True,
                     show=_interrupt_when_running, queue_poll_s=1) == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    kept = [entry["job"] for entry in _jobs(out).values()]
    assert "keep running" in err and set(kept).isdisjoint(first)
    # another split of the same sweep would share their samples: refused while they run
    assert run_cli("submit", "--shards", 3, "--executor", "slurm", *ONE_CORE, "--", *_compare(models, out)) == 2
    assert "of a 2-shard submit of this sweep still run" in capsys.readouterr().err
    with hang_guard(300):
        assert run_sweep(_compare(models, out), 2, settings, queue_poll_s=1) == 0
    captured = capsys.readouterr()
    assert "attaching to" in captured.err and "submitted" not in captured.err
    assert [entry["job"] for entry in _jobs(out).values()] == kept
    _assert_the_whole_sweep(out, one_process, captured.out)


def _shard_1_hangs(command, shard, sweep_id, threads):
    """Shard 1 waits to be cancelled; shard 0 runs."""
    if shard[0] == 1:
        import time as clock

        clock.sleep(900)
    from bamctl.cli.submit_commands import run_shard

    run_shard(command, shard, sweep_id, threads)


def _cancel_when_running(slurm, out, index):
    for _ in range(600):
        jobs = _jobs(out) if sweep.records(out) else {}
        if index in jobs:
            state = slurm.run("squeue", "--noheader", "--jobs", jobs[index]["job"], "--format", "%T", check=False).stdout.strip()
            if state == "RUNNING":
                slurm.run("scancel", jobs[index]["job"])
                return
        time.sleep(0.5)


def test_without_accounting_a_cancelled_shard_is_reported_failed_and_the_rerun_resumes(slurm, models, one_process, tmp_path, capsys):
    import cloudpickle

    from bamctl.cli.submit_commands import run_sweep

    assert slurm.run("sacct", check=False).returncode != 0  # no accounting: submitit alone sees nothing end
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the jobs cannot import this test module
    out = tmp_path / "results"
    settings = JobSettings(executor="slurm", logs=tmp_path / "logs", cpus=1, minutes=10)
    canceller = threading.Thread(target=_cancel_when_running, args=(slurm, out, 1), daemon=True)
    canceller.start()
    with hang_guard(300):
        assert run_sweep(_compare(models, out), 2, settings, shard_job=_shard_1_hangs, queue_poll_s=2) == 1
    err = capsys.readouterr().err
    job = _jobs(out)[1]
    assert f"shard 1/2 failed (job {job['job']}, CANCELLED" in err and f"(log: {job['log']})" in err
    assert "CANCELLED" in err.split("shard 1/2 failed")[1].split("(log:")[0]  # the cause: slurmstepd's line

    with hang_guard(300):
        assert run_cli("submit", "--shards", 2, "--executor", "slurm", *ONE_CORE, "--logs", tmp_path / "logs",
                       "--", *_compare(models, out)) == 0
    captured = capsys.readouterr()
    assert "submitted 1 of 2 shards" in captured.err
    _assert_the_whole_sweep(out, one_process, captured.out)


def test_a_drained_node_shows_why_shards_wait(slurm, models, tmp_path, capsys):
    from bamctl.cli.submit_commands import EXIT_INTERRUPTED, run_sweep

    node = slurm.run("sinfo", "--noheader", "--format", "%n").stdout.split()[0]
    slurm.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=maintenance")
    seen = []

    def interrupt_on_a_reason(line):
        seen.append(line)
        if "waiting (" in line:
            raise KeyboardInterrupt

    try:
        out = tmp_path / "results"
        settings = JobSettings(executor="slurm", logs=tmp_path / "logs", cpus=1, minutes=10)
        with hang_guard(120):
            assert run_sweep(_compare(models, out), 2, settings, show=interrupt_on_a_reason, queue_poll_s=1) == EXIT_INTERRUPTED
        assert "2 waiting (" in seen[-1] and seen[-1].split("waiting (")[1].split(")")[0]  # squeue's reason, shown
    finally:
        slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME")


def test_what_sbatch_refuses_is_one_line_before_any_record(slurm, models, tmp_path, capsys):
    out = tmp_path / "results"
    assert run_cli("submit", "--executor", "slurm", "--slurm", "foo=bar", "--", *_compare(models, out)) == 2
    assert run_cli("submit", "--executor", "slurm", "--gpus-per-shard", "1", "--", *_compare(models, out)) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 2 and all("sbatch refuses these shards" in line for line in lines)  # one line each
    assert "foo" in err
    assert not out.exists()  # no sweep record, no rows


def test_dry_run_prints_the_sbatch_script(slurm, models, tmp_path, capsys):
    out = tmp_path / "results"
    assert run_cli("submit", "--shards", 3, "--executor", "slurm", "--mem", "1G", "--qos", "normal", "--constraint", "fast",
                   "--account", "proj", "--dry-run", "--", *_compare(models, out)) == 0
    script = capsys.readouterr().out
    assert script.startswith("#!/bin/bash")
    for flag in ("#SBATCH --array=0-2%3", "#SBATCH --mem=1G", "#SBATCH --qos=normal", "#SBATCH --constraint=fast",
                 "#SBATCH --account=proj", "#SBATCH --time=240"):
        assert flag in script
    assert not out.exists()


@pytest.mark.parametrize("array, expected", [("1-2", {"1": "0/2", "2": "1/2"}),
                                             ("0-2:2", {"0": "0/2", "2": "1/2"})])
def test_shard_auto_in_an_offset_or_stepped_array(slurm, tmp_path, array, expected):
    """What Slurm itself sets in an array's tasks, read by --shard auto: one shard per task, none outside."""
    probe = (f"{sys.executable} -c 'import os; from bamctl.cluster.shards import shard_from_environment as s; "
             "(i, n), _ = s(os.environ); print(f\"{i}/{n}\")'")
    slurm.run("sbatch", f"--array={array}", "--cpus-per-task=1", f"--output={tmp_path}/%a.out", "--wrap", probe)
    for _ in range(120):
        outputs = {p.stem: p.read_text().strip() for p in tmp_path.glob("*.out")}
        if len(outputs) == len(expected) and all(outputs.values()):
            break
        time.sleep(0.5)
    assert outputs == expected


def _shard_1_stalls_after_a_row_until_preempted(command, shard, sweep_id, threads):
    """Shard 1, on its first start, stores one row and then stalls, as a long sample would, until
    preempted; started again (SLURM_RESTART_COUNT), it runs as any shard."""
    import os

    if shard[0] == 1 and not int(os.environ.get("SLURM_RESTART_COUNT", "0")):
        import time as clock

        from bamctl.results.store import ResultStore as Store

        append = Store.append

        def append_then_stall(self, rows):
            path = append(self, rows)
            clock.sleep(900)
            return path

        Store.append = append_then_stall
    from bamctl.cli.submit_commands import run_shard

    run_shard(command, shard, sweep_id, threads)


def _requeue_after_its_first_row(slurm, out, index, done):
    """What a preemption does: the running job is killed and put back in the queue."""
    for _ in range(600):
        jobs = _jobs(out) if sweep.records(out) else {}
        rows = ResultStore(out).read_table(dedupe=False).to_pandas() if ResultStore(out).part_files() else None
        if index in jobs and rows is not None and len(rows) >= 1:
            time.sleep(2)  # shard 0 may have written it: give shard 1 its row too
            done.append(slurm.run("scontrol", "requeue", jobs[index]["job"], check=False))
            # Slurm holds a requeued job back two minutes (BeginTime): that wait is not under test
            job = jobs[index]["job"]
            for _ in range(120):
                state = slurm.run("squeue", "--noheader", "--jobs", job, "--format", "%T", check=False).stdout.strip()
                if state == "PENDING":
                    done.append(slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now", check=False))
                    return
                time.sleep(0.5)
            return
        time.sleep(0.5)


def test_with_accounting_a_preempted_shard_resumes_and_nothing_doubles(slurm_with_accounting, models, one_process, tmp_path, capsys):
    import cloudpickle

    from bamctl.cli.submit_commands import run_sweep

    slurm = slurm_with_accounting
    assert slurm.run("sacct", check=False).returncode == 0
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    out = tmp_path / "results"
    settings = JobSettings(executor="slurm", logs=tmp_path / "logs", cpus=1, minutes=10)
    requeued = []
    threading.Thread(target=_requeue_after_its_first_row, args=(slurm, out, 1, requeued), daemon=True).start()
    with hang_guard(400):
        assert run_sweep(_compare(models, out), 2, settings, shard_job=_shard_1_stalls_after_a_row_until_preempted,
                         queue_poll_s=1) == 0
    assert requeued and requeued[0].returncode == 0, requeued and requeued[0].stderr  # it was preempted
    _assert_the_whole_sweep(out, one_process, capsys.readouterr().out)
