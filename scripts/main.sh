#!/usr/bin/env bash
# The main job on shipped defaults (README's first command runs it after set-up):
# every shipped reference model on passkey retrieval from 1x to 64x its training
# length (128 -> 8k tokens), 5 depths x 2 samples = 10 prompts per cell (seed 0);
# `bash scripts/main.sh --seed 0,1 --samples 4` gives the 40-per-cell table in README.md.
# Prints the comparison table and writes results/main-passkey.png (next to the results, which stay a plain Parquet dataset). A rerun skips
# the samples already in results/main (add --force to recompute).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python.sh
"$PYTHON" -m bamctl models
"$PYTHON" -m bamctl compare nope sinusoidal rope alibi bam nope-ssmax rope-ssmax alibi-ssmax bam-ssmax \
  --task passkey --seed 0 --samples 2 --out results/main --plot results/main-passkey.png "$@"
