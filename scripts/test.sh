#!/usr/bin/env bash
# The test suite (README's second command runs it after set-up). Extra arguments go to
# pytest, e.g. `bash scripts/test.sh -m slow` for the slow tests.
#
#   bash scripts/test.sh --vllm     # the tests that start real vLLM, in .venv-vllm
#                                   # (scripts/setup.sh --vllm); -m 'vllm and slow' for the long ones
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--vllm" ]; then
  shift
  # vLLM's own environment where set-up made it; elsewhere .venv, where the vllm tests skip and say why
  if [ -x .venv-vllm/bin/python ] && .venv-vllm/bin/python -c "import pytest, bamctl" 2>/dev/null; then
    VENV=.venv-vllm
  fi
  set -- -m "vllm and not slow" "$@"
fi
source scripts/python.sh
exec "$PYTHON" -m pytest "$@"
