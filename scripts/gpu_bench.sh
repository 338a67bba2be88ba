#!/usr/bin/env bash
# GPU benchmark: passkey 1k..512k on an l12-sized random BAM+SSMax model in bf16,
# seconds per sample against the FLOP floor. Prepared for a lent GPU machine:
#   bash scripts/gpu_bench.sh [extra args for bench/gpu_passkey.py]
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi -L
python3 -m pip install --quiet --no-deps -e . 2>/dev/null || python3 -m pip install --quiet -e .
python3 bench/gpu_passkey.py --lengths 1k..512k --chunk-size 8192 "$@"
