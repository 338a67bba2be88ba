"""A real one-node Slurm for the `slurm`-marked tests, started by scripts/slurm/start.sh.

One Slurm runs at a time, on free ports, in a folder of its own: asking for the other
accounting mode stops the running one and starts the other. The last one is stopped when
the session ends. Where none can be started (not root, slurm-wlm or munge missing, or for
accounting slurmdbd and mariadb-server missing), the test is skipped and says which.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
START, STOP = ROOT / "scripts" / "slurm" / "start.sh", ROOT / "scripts" / "slurm" / "stop.sh"
NEEDED = {False: ("munged", "slurmctld", "slurmd", "sbatch"), True: ("slurmdbd", "mariadbd", "sacctmgr")}
INSTALL = {False: "apt-get install slurm-wlm munge", True: "apt-get install slurmdbd mariadb-server"}


@dataclass
class Slurm:
    folder: Path
    accounting: bool

    @property
    def conf(self) -> Path:
        return self.folder / "slurm.conf"

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(command, env=self.env(), capture_output=True, text=True, check=check, timeout=60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def why_not(accounting: bool) -> str | None:
    """Why no Slurm can be started here; None when one can."""
    if os.geteuid() != 0:
        return "a Slurm of its own needs root (slurmd starts jobs as their user); run the slurm tests as root"
    for mode in {False, accounting}:
        missing = [tool for tool in NEEDED[mode] if shutil.which(tool) is None]
        if missing:
            return f"{', '.join(missing)} not installed ({INSTALL[mode]}; .ci/run installs it where apt can)"
    return None


class SlurmManager:
    def __init__(self) -> None:
        self.current: Slurm | None = None

    def get(self, accounting: bool) -> Slurm:
        if self.current is not None and self.current.accounting == accounting:
            return self.current
        reason = why_not(accounting)
        if reason:
            pytest.skip(reason)
        self.stop()
        folder = Path(tempfile.mkdtemp(prefix="bamctl-slurm-"))
        ports = {"SLURMCTLD_PORT": _free_port(), "SLURMD_PORT": _free_port(), "SLURMDBD_PORT": _free_port(), "MARIADB_PORT": _free_port()}
        env = {**os.environ, **{k: str(v) for k, v in ports.items()}}
        started = subprocess.run(["bash", str(START), *(["--accounting"] if accounting else []), str(folder)],
                                 env=env, capture_output=True, text=True, timeout=300)
        if started.returncode != 0:
            shutil.rmtree(folder, ignore_errors=True)  # start.sh stopped what it had started
            pytest.fail(f"scripts/slurm/start.sh failed: {started.stderr.strip() or started.stdout.strip()}")
        self.current = Slurm(folder, accounting)
        return self.current

    def stop(self) -> None:
        if self.current is not None:
            subprocess.run(["bash", str(STOP), str(self.current.folder)], capture_output=True, timeout=120)
            shutil.rmtree(self.current.folder, ignore_errors=True)
            self.current = None
