#!/usr/bin/env bash
# The main job on shipped defaults (README's first command runs it after set-up):
# 1. the nine passkey reference models (bam-ssmax first: the baseline of the paired
#    tests) on passkey retrieval at 1x, 4x, 16x and 64x their training length (128,
#    512, 2k, 8k tokens; chunks of 1,024 tokens), 35 keys per cell, each at depth 0.5
#    (seed 0): the statistics count keys, not prompts (the depths of one key share
#    it), and 35 keys are the fewest at which a perfect cell's Wilson lower bound
#    passes 0.9, so the certified effective length can be read;
#    `bash scripts/main.sh --lengths 128..8k --depths 5 --seed 230039,414707 --samples 18`
#    gives README's held-out table (180 prompts on 36 keys per cell; extra arguments
#    go to this comparison);
# 2. the six language-model references on sliding-window perplexity of the shipped
#    perplexity text from 1x to 16x their training length (256 -> 4k tokens) on 9
#    documents, the fewest with which the paired test over documents can show a
#    difference after Holm over the 5 lengths (5 x 2/2^9 < 0.05); about the time one
#    16k document took (README's table: 8 held-out documents to 64x, --seed 230039,414707 --samples 4).
# Prints both tables and writes plots/main-passkey.png and plots/main-ppl.png (outside
# results/, which stays a plain Parquet dataset: pandas.read_parquet("results") reads
# exactly the rows stored). A rerun skips the
# samples already in results/main (add --force to recompute).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python.sh
"$PYTHON" -m bamctl models
"$PYTHON" -m bamctl compare bam-ssmax nope sinusoidal rope alibi bam nope-ssmax rope-ssmax alibi-ssmax --lengths 128,512,2k,8k --chunk-size 1024 \
  --task passkey --depths 0.5 --seed 0 --samples 35 --dir results/main --plot plots/main-passkey.png "$@"
force=()
for arg in "$@"; do [[ "$arg" == "--force" ]] && force=(--force); done
"$PYTHON" -m bamctl compare lm-bam lm-nope lm-sinusoidal lm-rope lm-alibi lm-bam-ssmax \
  --task ppl --lengths 256..4k --seed 0 --samples 9 --dir results/main --plot plots/main-ppl.png "${force[@]}"
