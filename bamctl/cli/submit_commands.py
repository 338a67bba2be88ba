"""``bamctl submit``: one evaluation command as N shards through submitit, then one table.

The command is checked here first, exactly as it would check itself (options, models,
tasks, plans); its sweep is recorded in its results directory only once sbatch has taken
the jobs, so what sbatch refuses leaves nothing behind. Each shard not yet finished runs as a
job, ``COMMAND --shard I/N``, and refuses to run if what it plans on its node is not that
sweep. A shard writes no table of its own: when every shard has finished, ``submit``
compacts the results directory and prints the command's table for the whole sweep itself,
from the stored rows, loading no model. Ctrl-C cancels the jobs it submitted (or, with
``--keep-jobs``, leaves them, and a rerun waits for them instead of submitting copies).
"""

from __future__ import annotations

import dataclasses
import shutil
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from bamctl.cli.app import app
from bamctl.errors import BamctlError

stderr = Console(stderr=True, highlight=False)
stdout = Console(highlight=False)

class Executor(str, Enum):
    auto = "auto"
    slurm = "slurm"
    local = "local"


EVALUATION_COMMANDS = ("passkey", "ruler", "ppl", "compare")
EXIT_SHARDS_FAILED = 1
EXIT_INTERRUPTED = 130  # as a shell reports a command stopped by Ctrl-C


def _call(argv: list[str]) -> None:
    """Run a bamctl command in this job's process: its errors are the job's (the traceback's last
    line in the log), and so is a non-zero exit."""
    code = app(args=argv, standalone_mode=False, prog_name="bamctl")
    if isinstance(code, int) and code:
        raise RuntimeError(f"bamctl {argv[0]} exited with code {code}")


def run_shard(command: list[str], shard: tuple[int, int], sweep_id: str, threads: int | None) -> None:
    """One job: shard ``shard`` of ``command``, which must plan the sweep ``sweep_id``."""
    from bamctl.cluster import sweep

    if threads:
        import torch

        torch.set_num_threads(threads)
    from bamctl.runs.runner import quiet_external_libraries

    quiet_external_libraries()  # no Hugging Face progress bars in a log file
    with sweep.expecting(sweep_id):
        # Not --quiet: a job's stderr is a log file, where each finished cell prints one line of
        # progress (time left included), so `tail -f` on a shard's log shows how far it is.
        _call([*command, "--shard", f"{shard[0]}/{shard[1]}"])


def plan_sweep(command: list[str]) -> tuple[dict, Path, dict]:
    """Check ``command`` as it would check itself and return its sweep, results directory and
    how it prints its table, running nothing."""
    from bamctl.cluster import sweep

    if not command or command[0] not in EVALUATION_COMMANDS:
        raise BamctlError(f"bamctl submit runs one of {', '.join(EVALUATION_COMMANDS)} (got {' '.join(command[:1]) or 'nothing'})")
    if any(arg == "--shard" or arg.startswith("--shard=") for arg in command):
        raise BamctlError("bamctl submit chooses each shard itself: leave --shard out of the command")
    try:
        with sweep.planning():
            app(args=[*command, "--quiet"], standalone_mode=False, prog_name="bamctl")
    except sweep.SweepPlanned as planned:
        return planned.description, planned.out, planned.report
    raise BamctlError(f"bamctl {command[0]} planned no sweep (was --help asked?)")


def _say(line: str) -> None:
    stderr.print(line, soft_wrap=True, markup=False)


def _print_table(command: list[str], record, shards: int, report: dict) -> None:
    """The command's table over the whole sweep, from what the shards covered; a split run by
    hand (no reports) falls back to running the command here, which finds every sample stored."""
    from bamctl.cli.eval_commands import _report
    from bamctl.results.store import ResultStore
    from bamctl.runs import shard_report
    from bamctl.runs.runner import covered_rows

    reports = record.reports(shards)
    if len(reports) < shards:
        _call([*command, "--quiet"])
        return
    covered, names_by_identity, versions = shard_report.merged(reports)
    _report(covered_rows(ResultStore(record.out).read(), covered, names_by_identity), report["names"], json_output=report["json"],
            threshold=report["threshold"], plot=Path(report["plot"]) if report["plot"] else None, baseline=report["baseline"],
            current_versions=versions, metric=report.get("metric", "score"),
            relative=report.get("relative"), base_length=report.get("base_length"))


def _dry_run(executor, command: list[str], todo: list[int], shards: int) -> None:
    from bamctl.cluster import submit

    if submit.is_local(executor):
        for index in todo:
            typer.echo(f"bamctl {' '.join(command)} --shard {index}/{shards}")
    else:
        typer.echo(submit.sbatch_script(executor, len(todo)), nl=False)
    _say(f"--dry-run: {len(todo)} of {shards} shards would be submitted; nothing was written or queued")


def run_sweep(command: list[str], shards: int, settings, *, shard_job=run_shard, keep_jobs: bool = False,
              dry_run: bool = False, show=_say, queue_poll_s: float | None = None) -> int:
    """Submit the shards of ``command`` that have not finished, wait, print the table; the exit code."""
    from bamctl.cluster import submit, sweep
    from bamctl.results.store import ResultStore

    description, out, report = plan_sweep(command)
    if settings.logs is None:
        settings = dataclasses.replace(settings, logs=out.parent / f"{out.name}-shards")
    executor = submit.make_executor(settings, name=f"bamctl-{command[0]}")
    local = submit.is_local(executor)
    if keep_jobs and local:
        raise BamctlError("--keep-jobs needs Slurm: local shards are processes of this command and end with it")
    record = sweep.SweepRecord(out, sweep.sweep_id(description))
    todo = sorted(set(range(shards)) - record.finished_shards(shards))
    for other in (n for n in record.split_counts() if n != shards):
        live = submit.attach(executor, record.recorded_jobs(other))
        if live:  # their samples are split otherwise: both splits running would compute some twice
            raise BamctlError(f"jobs {', '.join(s.job_id for s in live)} of a {other}-shard submit of this sweep still run; "
                              f"wait for them (bamctl submit --shards {other} ... attaches) or scancel them first")
    attached = submit.attach(executor, {i: job for i, job in record.recorded_jobs(shards).items() if i in todo})
    to_submit = [i for i in todo if i not in {shard.index for shard in attached}]
    if dry_run:
        _dry_run(executor, command, to_submit, shards)
        return 0
    record = sweep.check_claim(out, description)
    jobs = list(attached)
    if attached:
        _say(f"sweep {record.id}: attaching to {len(attached)} live jobs of an earlier submit: {', '.join(s.job_id for s in attached)}")
    if to_submit:
        threads = submit.threads_per_shard(executor, min(shards, len(to_submit)))
        # sbatch first: what it refuses leaves no record behind; a shard starts long after the record is written
        submitted = submit.submit_shards(executor, shard_job, lambda i: (command, (i, shards), record.id, threads), to_submit)
        record.write(description)
        kind = "local" if local else "slurm"
        record.record_jobs(shards, {s.index: {"job": s.job_id, "log": str(s.log), "executor": kind} for s in submitted})
        _say(f"sweep {record.id}: submitted {len(to_submit)} of {shards} shards ({'local' if local else 'slurm'}; logs in {settings.logs})")
        for shard in submitted:
            _say(f"  shard {shard.index}/{shards}: job {shard.job_id}, log {shard.log}")
        jobs += submitted
    if jobs:
        try:
            submit.wait(jobs, record, shards, local=local, show=show,
                        **({} if queue_poll_s is None else {"queue_poll_s": queue_poll_s}))
        except KeyboardInterrupt:
            return _interrupted(executor, jobs, keep_jobs)
        failed = [job for job in jobs if job.failed]
        if failed:
            for job in failed:
                how = "" if local else f", {job.state}"
                _say(f"shard {job.index}/{shards} failed (job {job.job_id}{how}): {job.last_error()} (log: {job.log})")
            _say(f"run the same command again to resubmit the {len(failed)} failed shards; finished samples are kept and skipped")
            return EXIT_SHARDS_FAILED
    else:
        record.write(description)
        _say(f"sweep {record.id}: all {shards} shards already finished")
    ResultStore(out).compact()  # one file, one row per key, for any reader (samples two runs computed included)
    _print_table(command, record, shards, report)
    return 0


def _interrupted(executor, jobs, keep_jobs: bool) -> int:
    from bamctl.cluster import submit

    live = [s.job_id for s in jobs if s.live]
    if keep_jobs:
        _say(f"interrupted: {len(live)} jobs keep running ({', '.join(live)}); run the same command again to wait "
             "for them (it attaches to them and submits nothing twice)")
    else:
        _say(f"interrupted: cancelling {len(live)} jobs ({', '.join(live)})")
        ending = submit.cancel(executor, jobs)
        if ending:
            _say(f"jobs {', '.join(ending)} are still ending: wait until squeue no longer lists them before running it again")
        else:
            _say("cancelled; finished samples are kept: run the same command again to resume (--keep-jobs leaves jobs running)")
    return EXIT_INTERRUPTED


def show_status(out: Path) -> None:
    """Each shard of each sweep recorded in ``out``: done, or its job's state (from squeue) and log."""
    from bamctl.cluster import slurm, sweep

    records = sweep.records(out)
    if not records:
        raise BamctlError(f"{out} holds no sweep (no {out / sweep.SWEEPS_DIR}); give the --dir of a sharded run")
    for record in records:
        for count in record.split_counts() or [0]:
            finished, jobs = record.finished_shards(count), record.recorded_jobs(count)
            on_slurm = shutil.which("squeue") is not None and any(e.get("executor") == "slurm" for e in jobs.values())
            queued = (slurm.queue([e["job"] for e in jobs.values() if e.get("executor") == "slurm"]) or {}) if on_slurm else {}
            table = Table(title=f"sweep {record.id}, {count} shards: {len(finished)} done", title_justify="left")
            for column in ("shard", "state", "job", "log"):
                table.add_column(column)
            for index in range(count):
                entry = jobs.get(index, {})
                job = entry.get("job", "")
                if index in finished:
                    state = "done"
                elif job in queued:
                    state = queued[job].state.lower() + (f" ({queued[job].reason})" if queued[job].reason not in ("", "None") else "")
                elif job:
                    ended = slurm.final_state(job) if on_slurm else None
                    state = f"ended without finishing{f' ({ended})' if ended else ''}: failed"
                else:
                    state = "not submitted"
                table.add_row(f"{index}/{count}", state, job, entry.get("log", ""))
            stdout.print(table)


def _slurm_parameters(pairs: list[str]) -> dict[str, str]:
    parameters = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise BamctlError(f"--slurm takes KEY=VALUE, an sbatch option without its dashes, e.g. account=myproj (got {pair!r})")
        parameters[key.removeprefix("--")] = value
    return parameters


@app.command(context_settings={"allow_interspersed_args": False})
def submit(
    command: Annotated[Optional[list[str]], typer.Argument(help="The evaluation command and its options, after --: compare|passkey|ruler|ppl ...", show_default=False)] = None,
    shards: Annotated[int, typer.Option("--shards", "-N", min=1, help="Number of shards (jobs), each taking every N-th sample.")] = 2,
    executor: Annotated[Executor, typer.Option(help="auto (Slurm when sbatch is on the PATH, else this machine), slurm or local.")] = Executor.auto,
    partition: Annotated[Optional[str], typer.Option(help="Slurm partition.")] = None,
    time_limit: Annotated[int, typer.Option("--time", min=1, help="Minutes each shard may run (Slurm's --time; the local executor kills it too).")] = 240,
    gpus: Annotated[int, typer.Option("--gpus-per-shard", min=0, help="GPUs each shard asks for (vllm: set --tensor-parallel to it).")] = 0,
    cpus: Annotated[Optional[int], typer.Option("--cpus-per-shard", min=1, help="CPU cores each shard asks Slurm for.")] = None,
    mem: Annotated[Optional[str], typer.Option("--mem", help="Memory each shard asks Slurm for (sbatch --mem), e.g. 64G.")] = None,
    account: Annotated[Optional[str], typer.Option(help="Slurm account to charge.")] = None,
    qos: Annotated[Optional[str], typer.Option(help="Slurm quality of service.")] = None,
    constraint: Annotated[Optional[str], typer.Option(help="Slurm node features the shards need (sbatch --constraint), e.g. a100.")] = None,
    slurm: Annotated[Optional[list[str]], typer.Option("--slurm", help="Any other sbatch parameter KEY=VALUE (exclude=node1, reservation=r); repeat for several.")] = None,
    logs: Annotated[Optional[Path], typer.Option(help="Folder of the jobs' logs and submission files (default: OUT-shards beside the results directory).")] = None,
    keep_jobs: Annotated[bool, typer.Option("--keep-jobs", help="On Ctrl-C leave the jobs running (a rerun waits for them) instead of cancelling them.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check everything, print the sbatch script (local: the shard commands), submit nothing.")] = False,
    status: Annotated[Optional[Path], typer.Option("--status", help="Show each shard's state of the sweeps in this results directory, and exit.", show_default=False)] = None,
) -> None:
    """Run one evaluation command as N shards on Slurm (or this machine), wait, and print its table.

    The results directory must be on a file system every node sees. Rerunning the same command resubmits only the shards that have not finished.

    Example: bamctl submit --shards 8 --partition gpu --gpus-per-shard 1 -- compare rope alibi bam-ssmax --task passkey --lengths 1k..64k --dir results/sweep
    """
    from bamctl.cluster.submit import JobSettings

    if status is not None:
        show_status(status)
        return
    if not command:
        raise BamctlError("bamctl submit needs the evaluation command after --, e.g. bamctl submit -- compare rope alibi --dir r (or --status DIR)")
    settings = JobSettings(executor=executor.value, logs=logs, minutes=time_limit, partition=partition, gpus=gpus, cpus=cpus,
                           mem=mem, account=account, qos=qos, constraint=constraint, slurm=_slurm_parameters(slurm or []))
    raise typer.Exit(run_sweep(command, shards, settings, keep_jobs=keep_jobs, dry_run=dry_run))
