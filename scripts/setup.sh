#!/usr/bin/env bash
# One-time set-up on a fresh machine (Python >= 3.11). Safe to run again.
# Without a GPU, install the CPU build of torch first: a bare `torch` requirement
# would otherwise pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    "$PYTHON" -m pip install --quiet "torch>=2.6"
  else
    "$PYTHON" -m pip install --quiet torch==2.13.0
  fi
fi
"$PYTHON" -m pip install --quiet --disable-pip-version-check -e ".[dev]"
# Compile the C++ CPU attention kernel now rather than inside the first evaluation.
# Where it cannot be built, bamctl falls back to torch's fused kernel; set-up goes on.
"$PYTHON" -c "from bamctl.engine.native import native_available; ok, why = native_available(); print('CPU attention kernel: ' + ('ready' if ok else why + ' (using the fused path)'))"
