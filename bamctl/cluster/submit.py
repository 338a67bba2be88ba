"""Running the shards of one sweep as jobs through submitit, and waiting for them.

Slurm where ``sbatch`` is present (one job array), else submitit's local executor (one
process per shard on this machine). A shard has finished when its sweep record marks it
(``bamctl.cluster.sweep``); a job that ended without that mark failed, whatever the
scheduler says, so a shard killed by the out-of-memory killer, a time limit or ``scancel``
counts as failed just like one that raised. Whether a Slurm job is alive comes from
``squeue`` (``bamctl.cluster.slurm``), so a cluster without accounting works too.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bamctl.cluster import joblog, slurm
from bamctl.cluster.sweep import SweepRecord
from bamctl.errors import BamctlError

EXECUTORS = ("auto", "slurm", "local")
QUEUE_POLL_S = 10.0  # how often squeue is asked, on Slurm: a vanished job is seen within this and one more poll
GONE_AFTER = 2  # polls a job must be missing from squeue before it counts as ended (a controller's hiccup is not an end)


@dataclass(frozen=True)
class JobSettings:
    """Where and how each shard runs (Slurm's options are ignored by the local executor)."""

    executor: str = "auto"  # auto: slurm when sbatch is on the PATH, else local
    logs: Path | None = None  # None: OUT-shards beside the results directory
    minutes: int = 240
    partition: str | None = None
    gpus: int = 0
    cpus: int | None = None
    mem: str | None = None  # sbatch --mem, e.g. 64G
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    slurm: dict[str, str] = field(default_factory=dict)  # extra sbatch parameters, --KEY=VALUE

    def sbatch_options(self) -> dict[str, str]:
        named = {"mem": self.mem, "account": self.account, "qos": self.qos, "constraint": self.constraint}
        return {**{key: value for key, value in named.items() if value}, **self.slurm}


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
    if settings.sbatch_options():
        parameters["slurm_additional_parameters"] = settings.sbatch_options()
    executor.update_parameters(**parameters)
    return executor


def is_local(executor: Any) -> bool:
    return executor.cluster in ("local", "debug")


def threads_per_shard(executor: Any, shards: int) -> int | None:
    """Local shards share this machine's cores: each gets its share instead of all of them."""
    return max(1, (os.cpu_count() or 1) // shards) if is_local(executor) else None


def sbatch_script(executor: Any, count: int) -> str:
    """The batch script submitit submits for ``count`` shards (one array when more than one)."""
    from submitit.slurm.slurm import _make_sbatch_string

    inner = executor._executor
    parameters = dict(inner.parameters)
    if count > 1:
        parameters["map_count"] = count
    return _make_sbatch_string(command=inner._submitit_command_str, folder=inner.folder, **parameters)


@dataclass
class ShardStatus:
    index: int
    job: Any
    finished: bool = False
    failed: bool = False
    state: str = "PENDING"  # as the scheduler says: PENDING, RUNNING, ... or how it ended
    reason: str = ""  # why a pending job waits, from squeue
    missing: int = 0  # consecutive squeue polls that did not list it

    @property
    def job_id(self) -> str:
        return str(self.job.job_id)

    @property
    def log(self) -> Path:
        return Path(self.job.paths.stderr)

    def last_error(self) -> str:
        return joblog.cause(self.log)

    @property
    def live(self) -> bool:
        return not (self.finished or self.failed)


def submit_shards(executor: Any, job: Callable, args_for: Callable[[int], tuple], indices: list[int]) -> list[ShardStatus]:
    """One job per shard index, as one Slurm array where the executor makes arrays; sbatch's
    refusal (an unknown option; a partition, account, QOS or GRES the cluster lacks) as one line."""
    try:
        # submitit echoes sbatch's stderr on a refusal; the one line below says it instead
        with contextlib.redirect_stderr(io.StringIO()), executor.batch():
            jobs = [executor.submit(job, *args_for(index)) for index in indices]
    except Exception as err:  # noqa: BLE001 - submitit raises its own types around sbatch's output
        raise BamctlError(f"sbatch refuses these shards: {slurm.first_error(str(err)) or type(err).__name__}") from None
    return [ShardStatus(index, job) for index, job in zip(indices, jobs)]


def attach(executor: Any, jobs: dict[int, dict]) -> list[ShardStatus]:
    """The recorded Slurm jobs of a sweep that are still queued or running, to wait for instead of resubmitting."""
    if is_local(executor) or not jobs:
        return []
    from submitit.slurm.slurm import SlurmJob

    queued = slurm.queue([entry["job"] for entry in jobs.values()])
    if queued is None:  # resubmitting could run a live shard twice
        raise BamctlError(f"cannot tell whether this sweep's jobs {', '.join(e['job'] for e in jobs.values())} still run: "
                          "squeue did not answer; try again")
    return [ShardStatus(index, SlurmJob(folder=executor._executor.folder, job_id=entry["job"]), state=queued[entry["job"]].state)
            for index, entry in sorted(jobs.items()) if entry["job"] in queued]


def cancel(executor: Any, shards: list[ShardStatus], *, wait_s: float = 60.0) -> list[str]:
    """Cancel the jobs of the shards still live and wait until they have left the queue, so that
    none writes a row after this returns; the ids of those still ending after ``wait_s``."""
    live = [s for s in shards if s.live]
    ids = [s.job_id for s in live]
    deadline = time.monotonic() + wait_s
    if is_local(executor):
        for shard in live:
            shard.job.cancel(check=False)
        while time.monotonic() < deadline and not all(s.job.done() for s in live):
            time.sleep(0.2)
        return [s.job_id for s in live if not s.job.done()]
    slurm.cancel(ids)
    left = slurm.queue(ids)
    while time.monotonic() < deadline and left != {}:
        time.sleep(1.0)
        left = slurm.queue(ids)
    return sorted(left) if left is not None else ids


def _update_slurm(shards: list[ShardStatus]) -> None:
    queued = slurm.queue([s.job_id for s in shards if s.live])
    if queued is None:  # squeue did not answer: nothing is concluded from it
        return
    for shard in shards:
        if not shard.live:
            continue
        if shard.job_id in queued:
            shard.state, shard.reason, shard.missing = queued[shard.job_id].state, queued[shard.job_id].reason, 0
        else:
            shard.missing += 1


def _ended(shard: ShardStatus, local: bool) -> bool:
    return shard.job.done() if local else shard.missing >= GONE_AFTER


def progress_line(shards: list[ShardStatus]) -> str:
    done, failed = sum(s.finished for s in shards), sum(s.failed for s in shards)
    running = sum(1 for s in shards if s.live and s.state in ("RUNNING", "COMPLETING"))
    waiting = [s for s in shards if s.live and s.state not in ("RUNNING", "COMPLETING")]
    reasons = sorted({s.reason for s in waiting if s.reason and s.reason != "None"})
    why = f" ({', '.join(reasons)})" if reasons else ""
    return f"shards: {done} done, {running} running, {len(waiting)} waiting{why}, {failed} failed"


def wait(shards: list[ShardStatus], record: SweepRecord, count: int, *, local: bool, show: Callable[[str], None],
         poll_s: float = 1.0, queue_poll_s: float = QUEUE_POLL_S) -> None:
    """Until every job has ended; ``show`` gets the progress line whenever it changes."""
    last, asked = None, float("-inf")
    while True:
        if not local and time.monotonic() - asked >= queue_poll_s:
            _update_slurm(shards)
            asked = time.monotonic()
        finished = record.finished_shards(count)
        for shard in shards:
            if not shard.live:
                continue
            if shard.index in finished:
                shard.finished = True
            elif _ended(shard, local):
                # the mark may be written an instant before the process ends: look once more
                shard.finished = shard.index in record.finished_shards(count)
                shard.failed = not shard.finished
                if shard.failed and not local:
                    shard.state = slurm.final_state(shard.job_id) or "ENDED"
            elif local:
                shard.state = shard.job.state
        line = progress_line(shards)
        if line != last:
            show(line)
            last = line
        if not any(s.live for s in shards):
            return
        time.sleep(poll_s)
