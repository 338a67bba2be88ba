"""`bamctl submit` with submitit's local executor, and the sweep check every shard makes.

Shards run as real processes on this machine, as they would on Slurm nodes; the models are
micro, the sweep a dozen rows, so the cost is the processes' start: about 20 s for each
test that submits, on an idle 2-core machine.
"""

import os
import re
import shutil
import sys

import pytest

from bamctl.cluster import sweep
from bamctl.cluster.submit import JobSettings
from bamctl.results.store import ResultStore
import cluster_sweep
from cluster_sweep import KEYS, ROWS, SWEEP, compare_command as _compare, models, one_process, run_cli, stable  # noqa: F401 - fixtures
from cluster_sweep import shard_slow_to_start

pytest.importorskip("submitit", reason="bamctl submit needs the cluster extra (pip install 'bamctl[cluster]')")


def _shard_killed_after_one_row(command, shard, sweep_id, threads):
    """Shard 1 dies hard (no merge, no mark, no clean-up) as its second row is about to be written."""
    if shard[0] == 1:
        from bamctl.results.store import ResultStore as Store

        append, written = Store.append, []

        def append_then_die(self, rows):
            if written:
                os._exit(137)
            written.append(rows)
            return append(self, rows)

        Store.append = append_then_die
    from bamctl.cli.submit_commands import run_shard

    run_shard(command, shard, sweep_id, threads)


def test_four_local_shards_give_exactly_the_rows_and_the_table_of_one_process(models, one_process, tmp_path, capsys):
    out = tmp_path / "results"
    assert run_cli("submit", "--shards", 4, "--executor", "local", "--", *_compare(models, out)) == 0
    captured = capsys.readouterr()
    rows, table = one_process
    stored = ResultStore(out).read_table(dedupe=False).to_pandas()
    assert len(stored) == len(rows) == ROWS  # nothing doubled
    assert stable(ResultStore(out).read()).equals(stable(rows))
    assert captured.out == table
    assert "shards: 4 done, 0 running, 0 waiting, 0 failed" in captured.err
    assert (tmp_path / "results-shards").is_dir()  # logs beside the results, never inside
    shard_logs = list((tmp_path / "results-shards").glob("*_log.*"))
    assert len(shard_logs) == 2 * 4  # stdout and stderr of each shard: no more jobs than shards
    assert not any("accuracy" in log.read_text() or "plot written" in log.read_text() for log in shard_logs)  # no partial tables
    errors = "".join(log.read_text() for log in shard_logs if log.name.endswith("_log.err"))
    assert re.search(r"passkey \S+ 128: \d+ samples? in .*% of the run done", errors)  # each shard's progress, a line per cell
    assert len(ResultStore(out).part_files()) == 1  # compacted: one file, one row per key


def test_a_killed_shard_is_named_and_only_it_is_resubmitted(models, one_process, tmp_path, capsys):
    import cloudpickle

    from bamctl.cli.submit_commands import run_sweep

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the jobs cannot import this test module
    out = tmp_path / "results"
    settings = JobSettings(executor="local", logs=tmp_path / "logs", minutes=10)
    assert run_sweep(_compare(models, out), 4, settings, shard_job=_shard_killed_after_one_row) == 1
    err = capsys.readouterr().err
    assert "shard 1/4 failed" in err and "1 failed" in err
    log = err.split("shard 1/4 failed")[1].split("(log: ")[1].split(")")[0]
    assert os.path.exists(log)
    partial = ResultStore(out).read()
    assert 0 < len(partial) < ROWS

    assert run_cli("submit", "--shards", 4, "--executor", "local", "--logs", tmp_path / "logs", "--", *_compare(models, out)) == 0
    captured = capsys.readouterr()
    assert "submitted 1 of 4 shards" in captured.err
    rows, table = one_process
    assert len(ResultStore(out).read_table(dedupe=False)) == ROWS  # the killed shard's first row was not redone
    assert stable(ResultStore(out).read()).equals(stable(rows))
    assert captured.out == table


def test_a_shard_with_other_task_options_is_refused_before_writing(models, tmp_path, capsys):
    out = tmp_path / "results"
    assert run_cli(*_compare(models, out), "--quiet", "--shard", "0/2") == 0
    before = ResultStore(out).part_files()
    # shard 1 of the same sweep, started with other depths: its slots would not be the other half
    other = [*_compare(models, out), "--depths", "0.5", "--quiet", "--shard", "1/2"]
    assert run_cli(*other) == 2
    err = capsys.readouterr().err
    assert "unfinished other sweep" in err and "depths" in err
    assert ResultStore(out).part_files() == before


def test_a_shard_asking_for_answer_logprobs_the_others_did_not_is_refused_before_writing(models, tmp_path, capsys):
    """Generated rows with and without the teacher-forced answer's figures would mix in one table."""
    out = tmp_path / "results"
    command = ["ruler", models[0], "--task", "niah_single_1", "--lengths", "256", "--samples", "2", "--dir", out, "--quiet"]
    assert run_cli(*command, "--shard", "0/2") == 0
    before = ResultStore(out).part_files()
    assert run_cli(*command, "--shard", "1/2", "--answer-logprob") == 2
    err = capsys.readouterr().err
    assert "unfinished other sweep" in err and "answer_logprob" in err, err
    assert ResultStore(out).part_files() == before
    assert run_cli(*command, "--shard", "1/2") == 0  # the sweep it belongs to goes on


def test_a_submitted_shard_refuses_a_sweep_other_than_the_one_submitted(models, tmp_path, capsys):
    from bamctl.cli.submit_commands import plan_sweep

    out = tmp_path / "results"
    description, planned_out, _ = plan_sweep(_compare(models, out))
    record = sweep.claim(planned_out, description)
    with sweep.expecting(record.id):  # what a job of `bamctl submit` runs under
        assert run_cli(*_compare(models, out), "--samples", "1", "--quiet", "--shard", "0/2") == 2
    assert "another sweep than the one submitted" in capsys.readouterr().err
    assert ResultStore(out).part_files() == []


def test_a_finished_sweep_may_be_extended_in_its_directory(models, tmp_path):
    out = tmp_path / "results"
    for i in range(2):
        assert run_cli(*_compare(models, out), "--quiet", "--shard", f"{i}/2") == 0
    longer = [*_compare(models, out), "--lengths", "128,256", "--quiet"]
    assert run_cli(*longer, "--shard", "0/2") == 0
    assert len(ResultStore(out).read()) == ROWS + ROWS // 2


def test_shard_auto_takes_the_torchrun_rank(models, tmp_path, monkeypatch):
    command = ["passkey", models[1], *SWEEP[2:], "--quiet"]
    assert run_cli(*command, "--shard", "1/2", "--dir", tmp_path / "explicit") == 0
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert run_cli(*command, "--shard", "auto", "--dir", tmp_path / "auto") == 0
    explicit, auto = ResultStore(tmp_path / "explicit").read(), ResultStore(tmp_path / "auto").read()
    assert len(auto) == ROWS // 4
    assert stable(auto).equals(stable(explicit))


def test_submit_refuses_a_command_it_cannot_shard(models, tmp_path, capsys):
    assert run_cli("submit", "--executor", "local", "--", "inspect", models[0]) == 2
    assert run_cli("submit", "--executor", "local", "--", *_compare(models, tmp_path / "r"), "--shard", "0/2") == 2
    assert run_cli("submit", "--executor", "local", "--", *_compare(models, tmp_path / "r"), "--lengths", "banana") == 2
    err = capsys.readouterr().err
    assert "compare" in err and "--shard" in err and "banana" in err
    if shutil.which("sbatch") is None:
        assert run_cli("submit", "--executor", "slurm", "--", *_compare(models, tmp_path / "r")) == 2
        assert "no Slurm here" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # refused before any work


def test_a_failed_shard_is_named_by_its_error_line(tmp_path):
    from types import SimpleNamespace

    from bamctl.cluster.submit import ShardStatus

    log = tmp_path / "123_0_log.err"
    log.write_text("submitit INFO (x) - Starting\nTraceback (most recent call last):\n  File x\n"
                   "bamctl.errors.BamctlError: --lengths reach 9,000 tokens, past m's maximum\n")
    shard = ShardStatus(1, SimpleNamespace(paths=SimpleNamespace(stderr=log)))
    assert shard.last_error() == "error: --lengths reach 9,000 tokens, past m's maximum"
    log.write_text("submitit INFO (x) - Starting\n")  # killed: nothing of its own
    assert "killed" in shard.last_error()
    # a Slurm time limit: the cause is submitit's line, not srun's report after it
    log.write_text("submitit WARNING (x) - Bypassing signal SIGCONT\n"
                   "submitit.core.utils.UncompletedJobError: Job not requeued because: timed-out and not checkpointable.\n"
                   "submitit INFO (x) - Exiting after failure\n"
                   "srun: error: vm: task 0: Exited with exit code 1\n")
    assert shard.last_error() == "submitit.core.utils.UncompletedJobError: Job not requeued because: timed-out and not checkpointable."


def _interrupt_when_running(line):
    """Ctrl-C, as the user presses it while shards run."""
    if ", 0 running" not in line:
        raise KeyboardInterrupt


def test_ctrl_c_cancels_the_local_shards_and_a_rerun_computes_nothing_twice(models, one_process, tmp_path, capsys):
    import cloudpickle

    from bamctl.cli.submit_commands import EXIT_INTERRUPTED, run_sweep

    cloudpickle.register_pickle_by_value(cluster_sweep)  # the jobs cannot import the tests' helpers
    out = tmp_path / "results"
    settings = JobSettings(executor="local", logs=tmp_path / "logs", minutes=10)
    # cancelling a local shard is a SIGINT, as a Ctrl-C is (tests/conftest.py: never ignored here)
    assert run_sweep(_compare(models, out), 2, settings, shard_job=shard_slow_to_start,
                     show=_interrupt_when_running) == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert "interrupted: cancelling 2 jobs" in err
    (jobs,) = [sweep.SweepRecord(out, r.id).recorded_jobs(2) for r in sweep.records(out)]
    assert all(entry["job"] in err for entry in jobs.values())  # named by id
    partial = len(ResultStore(out).read_table(dedupe=False))
    assert partial < ROWS  # cancelled, not finished
    assert run_cli("submit", "--shards", 2, "--executor", "local", "--logs", tmp_path / "logs", "--", *_compare(models, out)) == 0
    rows, table = one_process
    assert stable(ResultStore(out).read()).equals(stable(rows))
    raw = ResultStore(out).read_table(dedupe=False).to_pandas()
    assert not raw.duplicated(subset=KEYS).any()
    assert capsys.readouterr().out == table


def test_dry_run_and_status_write_nothing_and_show_the_shards(models, tmp_path, capsys):
    out = tmp_path / "results"
    assert run_cli("submit", "--shards", 2, "--executor", "local", "--dry-run", "--", *_compare(models, out)) == 0
    captured = capsys.readouterr()
    assert captured.out.count("--shard ") == 2 and "--shard 1/2" in captured.out
    assert not out.exists()
    assert run_cli("submit", "--status", out) == 2  # nothing recorded there
    assert "holds no sweep" in capsys.readouterr().err
    assert run_cli(*_compare(models, out), "--quiet", "--shard", "0/2") == 0  # one shard of two, run by hand
    capsys.readouterr()
    assert run_cli("submit", "--status", out) == 0
    shown = capsys.readouterr().out
    assert "0/2" in shown and "done" in shown and "1/2" in shown and "not submitted" in shown


def test_submit_without_a_command_is_one_line_and_exit_2(capsys):
    assert run_cli("submit") == 2
    err = capsys.readouterr().err
    assert "needs the evaluation command" in err and "Traceback" not in err
