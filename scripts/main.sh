#!/usr/bin/env bash
# The main job on shipped defaults: what README.md's first command runs after set-up.
# For now: build a random tiny BAM+SSMax model and inspect its priors.
set -euo pipefail
cd "$(dirname "$0")/.."
out=results/demo-model
bamctl new --pe bam-ssmax --preset tiny --seed 0 --out "$out"
bamctl inspect "$out"
