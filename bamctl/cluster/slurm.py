"""What Slurm's own commands say about jobs: ``squeue``, ``scontrol``, ``sacct``; ``scancel``.

Whether a job is still alive comes from ``squeue``, which every Slurm answers: ``sacct``
needs accounting (slurmdbd), which many small clusters run without, and submitit, which
asks only ``sacct``, then counts a cancelled job as unfinished forever. A job ``squeue``
no longer lists has ended; how it ended comes from ``scontrol`` while the controller still
holds it (``MinJobAge``, 5 minutes by default), else from ``sacct`` where it works.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

TIMEOUT_S = 30


@dataclass(frozen=True)
class QueuedJob:
    state: str  # PENDING, RUNNING, COMPLETING, ...
    reason: str  # why a pending job waits (Resources, Priority, ReqNodeNotAvail, ...); "None" when it does not


def _run(command: list[str]) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _array_of(job_id: str) -> str:
    return job_id.split("_", 1)[0]


def queue(job_ids: list[str]) -> dict[str, QueuedJob] | None:
    """The jobs among ``job_ids`` still in Slurm's queue (pending, running, completing); None
    when ``squeue`` did not answer, so that a controller's hiccup is not taken for jobs ending."""
    if not job_ids:
        return {}
    arrays = sorted({_array_of(job) for job in job_ids})
    done = _run(["squeue", "--noheader", "--array", "--jobs", ",".join(arrays), "--format", "%i|%T|%r"])
    if done is None or (done.returncode != 0 and "Invalid job id" not in done.stderr):
        return None
    listed = {}
    for line in done.stdout.splitlines():
        job, _, rest = line.strip().partition("|")
        state, _, reason = rest.partition("|")
        listed[job] = QueuedJob(state, reason)
    return {job: listed[job] for job in job_ids if job in listed}


def final_state(job_id: str) -> str | None:
    """How a job that left the queue ended (CANCELLED, TIMEOUT, FAILED, OUT_OF_MEMORY, ...), where Slurm still knows."""
    shown = _run(["scontrol", "show", "job", "--oneliner", job_id])
    if shown is not None and shown.returncode == 0:
        for field in shown.stdout.split():
            if field.startswith("JobState="):
                return field.removeprefix("JobState=")
    accounted = _run(["sacct", "--noheader", "--parsable2", "--allocations", "--format", "State", "--jobs", job_id])
    if accounted is not None and accounted.returncode == 0 and accounted.stdout.strip():
        return accounted.stdout.split()[0]
    return None


def cancel(job_ids: list[str]) -> str | None:
    """``scancel`` the jobs; the error it printed, if any."""
    if not job_ids:
        return None
    done = _run(["scancel", *job_ids])
    if done is None:
        return "scancel did not answer"
    return done.stderr.strip() or None if done.returncode else None


def first_error(text: str) -> str:
    """The line of sbatch's output that says what is wrong (not its "Try sbatch --help" hint)."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("Try ")]
    errors = [line for line in lines if "error" in line.lower() or "unrecognized" in line.lower() or "invalid" in line.lower()]
    return (errors or lines or [""])[-1].removeprefix("sbatch: ").removeprefix("error: ")
