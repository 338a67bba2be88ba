"""Helpers shared by the benchmark scripts: run a child process and read its peak memory."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_measured(cmd: list[str], *, memory_limit_bytes: int | None = None) -> tuple[int, float, int, str]:
    """Run ``cmd``; return (exit code, wall seconds, peak RSS bytes of the child, stderr tail)."""
    def limit():
        if memory_limit_bytes:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))

    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=limit, cwd=REPO)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    err = proc.stderr.read()
    out = proc.stdout.read()
    code = os.waitstatus_to_exitcode(status)
    return code, seconds, usage.ru_maxrss * 1024, (out + err).strip().splitlines()[-1:] and (out + err).strip().splitlines()[-1]


def default_model() -> str:
    """The shipped BAM+SSMax baseline, or a random micro BAM+SSMax made once for benchmarking."""
    shipped = REPO / "bamctl" / "data" / "baselines" / "bam-ssmax"
    if (shipped / "config.json").is_file():
        return str(shipped)
    path = Path("/tmp/bamctl-bench-model")
    if not (path / "config.json").is_file():
        subprocess.run([sys.executable, "-m", "bamctl", "new", "--pe", "bam-ssmax", "--preset", "micro", "--out", str(path)], check=True)
    return str(path)
