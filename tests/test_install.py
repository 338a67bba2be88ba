"""What ships: a wheel built from the tree, installed outside the checkout, runs every task.

The wheel is installed with ``pip install --no-deps --target``, so it runs on this
environment's torch and friends but with none of the checkout's files: task data,
texts and reference checkpoints must travel inside the package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("install")
    wheels, target = root / "wheels", root / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels)],
        check=True, capture_output=True, text=True, cwd=root,
    )
    (wheel,) = wheels.glob("bamctl-*.whl")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        check=True, capture_output=True, text=True, cwd=root,
    )
    return root, target


def run(installed, *args):
    root, target = installed
    env = {k: v for k, v in os.environ.items() if not k.startswith("BAMCTL_")}
    env["PYTHONPATH"] = str(target)
    return subprocess.run([sys.executable, "-m", "bamctl", *args], cwd=root, env=env, capture_output=True, text=True, timeout=600)


def test_the_installed_package_is_the_one_running(installed):
    root, target = installed
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = subprocess.run([sys.executable, "-c", "import bamctl; print(bamctl.__file__)"], cwd=root, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(target))


def test_installed_wheel_lists_every_shipped_model(installed):
    result = run(installed, "models", "--json")
    assert result.returncode == 0, result.stderr
    listed = {entry["name"] for entry in json.loads(result.stdout)}
    shipped = {p.parent.name for p in (REPO / "bamctl" / "data" / "baselines").glob("*/config.json")}
    assert listed == shipped and len(shipped) >= 9


@pytest.mark.parametrize("args", [
    ["passkey", "bam", "--lengths", "256", "--samples", "1"],
    ["ruler", "bam", "--task", "niah_single_1", "--lengths", "512", "--samples", "1"],
    ["ppl", "bam", "--lengths", "256"],
    ["ppl", "lm-bam", "--lengths", "256"],
])
def test_installed_wheel_runs_every_task(installed, args, tmp_path):
    result = run(installed, *args, "--dir", str(tmp_path / "out"), "--quiet", "--json")
    assert result.returncode == 0, result.stderr
    summaries = json.loads(result.stdout)["summaries"]
    assert len(summaries) == 1 and summaries[0]["cells"]
