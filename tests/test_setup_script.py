"""scripts/setup.sh on an interpreter that cannot make a virtual environment: one line, the fix."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_a_python_without_venv_gets_one_line_naming_the_fix(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    fake = tmp_path / "python-without-venv"
    # Like Debian's python3 without python3-venv: `-m venv` fails (and may leave a partial folder).
    fake.write_text('#!/bin/sh\nif [ "$1" = "-m" ] && [ "$2" = "venv" ]; then mkdir -p "$3"; echo "ensurepip is not available" >&2; exit 1; fi\nexit 0\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    result = subprocess.run(["bash", "scripts/setup.sh"], cwd=tmp_path, env={**env, "PYTHON": str(fake)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "python3-venv" in lines[0]
    assert not (tmp_path / ".venv").exists()  # no half-made environment left behind


def test_the_readme_commands_are_the_scripts_ci_runs():
    readme = (REPO / "README.md").read_text()
    assert "bash scripts/setup.sh && bash scripts/main.sh" in readme
    assert "bash scripts/setup.sh && bash scripts/test.sh" in readme
    assert "bash scripts/setup.sh && bash scripts/test.sh" in (REPO / ".ci" / "run").read_text()


def test_the_suite_collects_as_the_pytest_command_runs_it():
    """`pytest` (unlike `python -m pytest`) does not put the working directory on sys.path;
    `-P` gives python the same start, so helper imports between test modules are checked."""
    import sys

    result = subprocess.run(
        [sys.executable, "-P", "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "tests/test_train_loop.py", "tests/test_train_data.py", "tests/test_fused.py"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
