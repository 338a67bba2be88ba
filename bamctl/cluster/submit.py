"""Running the shards of one sweep as jobs through submitit, and waiting for them.

Slurm where ``sbatch`` is present (one job array), else submitit's local executor (one
process per shard on this machine). A shard has finished when its sweep record marks it
(``bamctl.cluster.sweep``); a job that ended without that mark failed, whatever the
scheduler says, so a shard killed by the out-of-memory killer or a time limit counts as
failed just like one that raised.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bamctl.cluster.sweep import SweepRecord
from bamctl.errors import BamctlError

EXECUTORS = ("auto", "slurm", "local")
BAMCTL_ERROR = f"{BamctlError.__module__}.{BamctlError.__name__}: "  # how a job's traceback ends on bad input


@dataclass(frozen=True)
class JobSettings:
    """Where and how each shard runs (Slurm's options are ignored by the local executor)."""

    executor: str = "auto"  # auto: slurm when sbatch is on the PATH, else local
    logs: Path | None = None  # None: OUT-shards beside the results directory
    minutes: int = 240
    partition: str | None = None
    gpus: int = 0
    cpus: int | None = None
    slurm: dict[str, str] = field(default_factory=dict)  # extra sbatch parameters, --KEY=VALUE


def make_executor(settings: JobSettings, name: str) -> Any:
    try:
        import submitit
    except ImportError:
        raise BamctlError("bamctl submit needs submitit: pip install 'bamctl[cluster]'") from None
    if settings.executor not in EXECUTORS:
        raise BamctlError(f"--executor takes {', '.join(EXECUTORS)} (got {settings.executor!r})")
    cluster = None if settings.executor == "auto" else settings.executor
    if cluster == "slurm" and submitit.AutoExecutor.which() != "slurm":
        raise BamctlError("--executor slurm: no Slurm here (sbatch is not on the PATH); use --executor local")
    executor = submitit.AutoExecutor(folder=settings.logs, cluster=cluster)
    parameters: dict[str, Any] = {"timeout_min": settings.minutes, "name": name}
    if settings.gpus:
        parameters["gpus_per_node"] = settings.gpus
    if settings.cpus:
        parameters["cpus_per_task"] = settings.cpus
    if settings.partition:
        parameters["slurm_partition"] = settings.partition
    if settings.slurm:
        parameters["slurm_additional_parameters"] = dict(settings.slurm)
    executor.update_parameters(**parameters)
    return executor


def is_local(executor: Any) -> bool:
    return executor.cluster in ("local", "debug")


def threads_per_shard(executor: Any, shards: int) -> int | None:
    """Local shards share this machine's cores: each gets its share instead of all of them."""
    return max(1, (os.cpu_count() or 1) // shards) if is_local(executor) else None


@dataclass
class ShardStatus:
    index: int
    job: Any
    finished: bool = False
    failed: bool = False

    @property
    def log(self) -> Path:
        return Path(self.job.paths.stderr)

    def last_error(self) -> str:
        """The last line of the shard's log: its error, as bamctl prints it where it is one of bamctl's."""
        try:
            lines = [line.strip() for line in self.log.read_text(encoding="utf-8", errors="replace").splitlines()]
        except OSError:
            return "no log"
        lines = [line for line in lines if line and not line.startswith("submitit ")]
        if not lines:
            return "no error written (killed?)"
        return "error: " + lines[-1].removeprefix(BAMCTL_ERROR) if lines[-1].startswith(BAMCTL_ERROR) else lines[-1]


def submit_shards(executor: Any, job: Callable, args_for: Callable[[int], tuple], indices: list[int]) -> list[ShardStatus]:
    """One job per shard index, as one Slurm array where the executor makes arrays."""
    with executor.batch():
        jobs = [executor.submit(job, *args_for(index)) for index in indices]
    return [ShardStatus(index, job) for index, job in zip(indices, jobs)]


def wait(shards: list[ShardStatus], record: SweepRecord, count: int, *, show: Callable[[str], None], poll_s: float = 1.0) -> None:
    """Until every job has ended; ``show`` gets the progress line whenever it changes."""
    last = None
    while True:
        finished = record.finished_shards(count)
        for shard in shards:
            if not shard.finished and not shard.failed:
                if shard.index in finished:
                    shard.finished = True
                elif shard.job.done():
                    # the mark may be written an instant before the process ends: look once more
                    shard.finished = shard.index in record.finished_shards(count)
                    shard.failed = not shard.finished
        running = sum(1 for s in shards if not (s.finished or s.failed) and s.job.state == "RUNNING")
        done, failed = sum(s.finished for s in shards), sum(s.failed for s in shards)
        line = f"shards: {done} done, {running} running, {len(shards) - done - failed - running} waiting, {failed} failed"
        if line != last:
            show(line)
            last = line
        if done + failed == len(shards):
            return
        time.sleep(poll_s)
