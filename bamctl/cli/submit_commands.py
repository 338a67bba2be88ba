"""``bamctl submit``: one evaluation command as N shards through submitit, then one table.

The command is checked here first, exactly as it would check itself (options, models,
tasks, plans), and its sweep recorded in its results directory; then each shard not yet
finished runs as a job, ``COMMAND --shard I/N``, and refuses to run if what it plans on
its node is not that sweep. When every shard has finished, one more job runs the command
unsharded: every sample is already stored, so it only prints the table the command
prints, for the whole sweep.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from bamctl.cli.app import app
from bamctl.errors import BamctlError

stderr = Console(stderr=True, highlight=False)

class Executor(str, Enum):
    auto = "auto"
    slurm = "slurm"
    local = "local"


EVALUATION_COMMANDS = ("passkey", "ruler", "ppl", "compare")
EXIT_SHARDS_FAILED = 1


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
    with sweep.expecting(sweep_id):
        _call([*command, "--shard", f"{shard[0]}/{shard[1]}", "--quiet"])


def run_report(command: list[str], sweep_id: str) -> str:
    """The last job: ``command`` unsharded over a complete sweep; what it printed."""
    from bamctl.cluster import sweep

    printed = io.StringIO()
    with sweep.expecting(sweep_id), contextlib.redirect_stdout(printed):
        _call([*command, "--quiet"])
    return printed.getvalue()


def plan_sweep(command: list[str]) -> tuple[dict, Path]:
    """Check ``command`` as it would check itself and return its sweep and results directory, running nothing."""
    from bamctl.cluster import sweep

    if not command or command[0] not in EVALUATION_COMMANDS:
        raise BamctlError(f"bamctl submit runs one of {', '.join(EVALUATION_COMMANDS)} (got {' '.join(command[:1]) or 'nothing'})")
    if any(arg == "--shard" or arg.startswith("--shard=") for arg in command):
        raise BamctlError("bamctl submit chooses each shard itself: leave --shard out of the command")
    try:
        with sweep.planning():
            app(args=[*command, "--quiet"], standalone_mode=False, prog_name="bamctl")
    except sweep.SweepPlanned as planned:
        return planned.description, planned.out
    raise BamctlError(f"bamctl {command[0]} planned no sweep (was --help asked?)")


def run_sweep(command: list[str], shards: int, settings, *, shard_job=run_shard, report_job=run_report) -> int:
    """Submit the shards of ``command`` that have not finished, wait, print the table; the exit code."""
    from bamctl.cluster import submit, sweep

    description, out = plan_sweep(command)
    if settings.logs is None:
        settings = dataclasses.replace(settings, logs=out.parent / f"{out.name}-shards")
    executor = submit.make_executor(settings, name=f"bamctl-{command[0]}")
    record = sweep.claim(out, description)
    todo = sorted(set(range(shards)) - record.finished_shards(shards))
    if todo:
        stderr.print(f"sweep {record.id}: submitting {len(todo)} of {shards} shards ({'local' if submit.is_local(executor) else 'slurm'}; logs in {settings.logs})", soft_wrap=True)
        threads = submit.threads_per_shard(executor, min(shards, len(todo)))
        jobs = submit.submit_shards(executor, shard_job, lambda i: (command, (i, shards), record.id, threads), todo)
        submit.wait(jobs, record, shards, show=lambda line: stderr.print(line, soft_wrap=True))
        failed = [job for job in jobs if job.failed]
        if failed:
            for job in failed:
                stderr.print(f"shard {job.index}/{shards} failed: {job.last_error()} (log: {job.log})", soft_wrap=True, markup=False)
            stderr.print(f"run the same command again to resubmit the {len(failed)} failed shards; finished samples are kept and skipped", soft_wrap=True)
            return EXIT_SHARDS_FAILED
    else:
        stderr.print(f"sweep {record.id}: all {shards} shards already finished", soft_wrap=True)
    report = submit.submit_shards(executor, report_job, lambda _: (command, record.id), [0])[0]
    try:
        printed = report.job.result()
    except Exception:  # noqa: BLE001 - submitit wraps the job's own error; the log holds it
        stderr.print(f"the table job failed: {report.last_error()} (log: {report.log})", soft_wrap=True, markup=False)
        return EXIT_SHARDS_FAILED
    sys.stdout.write(printed)
    return 0


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
    command: Annotated[list[str], typer.Argument(help="The evaluation command and its options, after --: compare|passkey|ruler|ppl ...", show_default=False)],
    shards: Annotated[int, typer.Option("--shards", "-N", min=1, help="Number of shards (jobs), each taking every N-th sample.")] = 2,
    executor: Annotated[Executor, typer.Option(help="auto (Slurm when sbatch is on the PATH, else this machine), slurm or local.")] = Executor.auto,
    partition: Annotated[Optional[str], typer.Option(help="Slurm partition.")] = None,
    time_limit: Annotated[int, typer.Option("--time", min=1, help="Minutes each shard may run (Slurm's --time; the local executor kills it too).")] = 240,
    gpus: Annotated[int, typer.Option("--gpus-per-shard", min=0, help="GPUs each shard asks for (vllm: set --tensor-parallel to it).")] = 0,
    cpus: Annotated[Optional[int], typer.Option("--cpus-per-shard", min=1, help="CPU cores each shard asks Slurm for.")] = None,
    slurm: Annotated[Optional[list[str]], typer.Option("--slurm", help="Extra sbatch parameter KEY=VALUE (account=myproj, qos=long, mem=64G); repeat for several.")] = None,
    logs: Annotated[Optional[Path], typer.Option(help="Folder of the jobs' logs and submission files (default: OUT-shards beside the results directory).")] = None,
) -> None:
    """Run one evaluation command as N shards on Slurm (or this machine), wait, and print its table.

    The results directory must be on a file system every node sees. Rerunning the same command resubmits only the shards that have not finished.

    Example: bamctl submit --shards 8 --partition gpu --gpus-per-shard 1 -- compare rope alibi bam-ssmax --task passkey --lengths 1k..64k --out results/sweep
    """
    from bamctl.cluster.submit import JobSettings

    settings = JobSettings(executor=executor.value, logs=logs, minutes=time_limit, partition=partition, gpus=gpus, cpus=cpus,
                           slurm=_slurm_parameters(slurm or []))
    raise typer.Exit(run_sweep(command, shards, settings))
