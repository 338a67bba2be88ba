#!/usr/bin/env bash
# One-time set-up on a fresh machine (Python >= 3.11, no GPU needed). Safe to run again.
#
# Installs into the active virtual environment, or else into .venv in this checkout
# (created here): a system Python marked externally managed (PEP 668, Debian and
# Ubuntu) refuses installs into itself. scripts/main.sh and scripts/test.sh find that
# .venv on their own; nothing needs activating.
#
# Without a GPU, the CPU build of torch goes in first: a bare `torch` requirement (ours,
# or an extra's) would otherwise pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if [ -z "${VIRTUAL_ENV:-}" ]; then
  if [ ! -x .venv/bin/python ]; then
    if ! "$PYTHON" -m venv .venv >/dev/null 2>&1; then
      rm -rf .venv
      echo "error: $PYTHON cannot create a virtual environment (its venv module is missing); install it, e.g. 'sudo apt install python3-venv', then run scripts/setup.sh again" >&2
      exit 1
    fi
  fi
  PYTHON=.venv/bin/python
fi

pip_install() { "$PYTHON" -m pip install --quiet --disable-pip-version-check "$@"; }
pip_install "setuptools>=68" wheel  # the wheel test builds without isolation
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    pip_install "torch>=2.6"
  else
    pip_install torch==2.13.0
  fi
fi
pip_install -e ".[dev,hf,cluster]"
# Compile the C++ CPU attention kernel now rather than inside the first evaluation (once per
# torch version and compiler flags, in a folder named by their digest).
# Where it cannot be built, bamctl falls back to torch's fused kernel; set-up goes on.
"$PYTHON" -c "from bamctl.engine.native import native_available; ok, why = native_available(); print('CPU attention kernel: ' + ('ready' if ok else why + ' (using the fused path)'))"
