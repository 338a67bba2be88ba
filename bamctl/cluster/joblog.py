"""The line of a shard's log that says why it failed.

A job's log ends with what the launcher and submitit wrote after the cause: ``srun: error:
node: task 0: Exited with exit code 1`` follows the traceback's last line, and submitit's
own lines (``submitit INFO ...``) follow everything. Those say that it failed, never why,
so they are passed over; bamctl's own errors are shown as bamctl prints them.
"""

from __future__ import annotations

from pathlib import Path

from bamctl.errors import BamctlError

BAMCTL_ERROR = f"{BamctlError.__module__}.{BamctlError.__name__}: "  # how a job's traceback ends on bad input
NOT_THE_CAUSE = ("submitit ", "srun: ")


def cause(log: Path) -> str:
    """The last line of ``log`` that says why the job failed."""
    try:
        lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        return "no log"
    lines = [line for line in lines if line and not line.startswith(NOT_THE_CAUSE)]
    if not lines:
        return "no error written (killed?)"
    last = lines[-1]
    return "error: " + last.removeprefix(BAMCTL_ERROR) if last.startswith(BAMCTL_ERROR) else last
