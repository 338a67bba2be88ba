#!/usr/bin/env bash
# The CUDA path on one GPU, in one run (planned for an H200, under 5 minutes):
#
#   bash scripts/gpu_run.sh OUTDIR              # on the GPU machine
#   bash scripts/gpu_run.sh OUTDIR --dry-run    # the same phases on the CPU at tiny sizes (or DRY_RUN=1)
#
# Phases, each under its own timeout (seconds; override with TIMEOUT_<PHASE>=...), each
# writing its table to OUTDIR as it goes (bench/gpu_bench.py), its log to OUTDIR/<phase>.log:
#   install    pip install --no-deps -e . (the machine's torch stays); which required packages are missing
#   tests      pytest -m cuda: attention paths against a float32 reference, auto, an authors' checkpoint, bf16
#   attention  FlexAttention BAM+SSMax against SDPA (causal, no bias) at 16k and 64k
#   passkey    a random l12 BAM+SSMax on passkey at 32k and 512k against the FLOP floor (bf16 matmul measured)
#   batches    the same model's passkey tokens/s at 4k, one request per call against --batch-size auto
# OUTDIR/summary.md lists each phase's exit status and seconds. A failed phase does not stop the next;
# the run exits 1 when any phase was short of ok.
# The source tree is first on PYTHONPATH, so every phase runs this checkout even if the install fails.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: bash scripts/gpu_run.sh OUTDIR [--dry-run]" >&2; exit 2; }
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
DRY=${DRY_RUN:-0}
[ "${2:-}" = "--dry-run" ] && DRY=1
PYTHON=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

if [ "$DRY" = 1 ]; then
  # Tiny sizes on the CPU; the cuda tests run there too (BAMCTL_CUDA_TESTS_ON_CPU), at 512 tokens.
  export BAMCTL_CUDA_TESTS_ON_CPU=1
  INSTALL="--dry-run"  # pip resolves and builds, installs nothing: the environment stays as it is
  ATTENTION=(--device cpu --lengths 512,1k --heads 2 --head-dim 48 --dtype float32 --repeats 1)
  PASSKEY=(--device cpu --preset tiny --lengths 512,1k --chunk-size 256 --matmul-size 256 --repeats 1)
  BATCHES=(--device cpu --preset tiny --lengths 512 --prompts 4 --chunk-size 256)
  : "${TIMEOUT_INSTALL:=120}" "${TIMEOUT_TESTS:=900}" "${TIMEOUT_ATTENTION:=600}" "${TIMEOUT_PASSKEY:=300}" "${TIMEOUT_BATCHES:=300}"
else
  INSTALL=""
  ATTENTION=(--lengths 16k,64k --repeats 3)
  PASSKEY=(--preset l12 --lengths 32k,512k --chunk-size 8192 --repeats 1)
  BATCHES=(--preset l12 --lengths 4k --prompts 32 --chunk-size 8192)
  # 555 s at most, under a 600 s limit on one command; the tests compile ~10 FlexAttention kernels, passkey ~10
  : "${TIMEOUT_INSTALL:=45}" "${TIMEOUT_TESTS:=170}" "${TIMEOUT_ATTENTION:=90}" "${TIMEOUT_PASSKEY:=190}" "${TIMEOUT_BATCHES:=60}"
fi

FAILED=0
printf '| phase | exit | seconds | status |\n|---|---|---|---|\n' > "$OUT/summary.md"
run_phase() {  # run_phase NAME TIMEOUT COMMAND...: log to OUTDIR/NAME.log, one summary row
  local name=$1 limit=$2 start rc status
  shift 2
  printf '\n== %s (timeout %ss)\n' "$name" "$limit"
  start=$EPOCHREALTIME
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  case $rc in 0) status=ok ;; 124|137) status="timed out" ;; *) status=failed ;; esac
  printf '| %s | %s | %s | %s |\n' "$name" "$rc" "$(awk "BEGIN { printf \"%.0f\", $EPOCHREALTIME - $start }")" "$status" >> "$OUT/summary.md"
  [ -f "$OUT/$name.md" ] && cat "$OUT/$name.md" || tail -n 5 "$OUT/$name.log"
  [ "$status" = ok ] || { FAILED=1; echo "-- $name: $status (exit $rc); last lines of $OUT/$name.log:"; tail -n 8 "$OUT/$name.log"; }
}

# Phases that are shell functions run under timeout as `bash -c NAME`: exported, with what they read.
install() {
  # offline: no build isolation (it would fetch setuptools), no dependencies (the machine's torch stays)
  "$PYTHON" -m pip install $INSTALL --quiet --no-deps --no-build-isolation -e . \
    || echo "pip install failed: running from the source tree (PYTHONPATH)"
  "$PYTHON" bench/gpu_bench.py deps
}
cuda_tests() {
  # --noconftest: the suite-wide fixture builds the C++ CPU kernel (a minute); no cuda test needs it.
  "$PYTHON" -m pytest -m cuda --noconftest -p no:cacheprovider -v -rs tests/test_cuda.py --junitxml="$OUT/cuda-tests.xml"
  local rc=$?
  "$PYTHON" bench/gpu_bench.py tests --out "$OUT" --junit "$OUT/cuda-tests.xml" > /dev/null
  return $rc
}

export PYTHON OUT INSTALL
export -f install cuda_tests
run_phase install "$TIMEOUT_INSTALL" bash -c install
run_phase cuda-tests "$TIMEOUT_TESTS" bash -c cuda_tests
run_phase attention "$TIMEOUT_ATTENTION" "$PYTHON" bench/gpu_bench.py attention --out "$OUT" "${ATTENTION[@]}"
run_phase passkey "$TIMEOUT_PASSKEY" "$PYTHON" bench/gpu_bench.py passkey --out "$OUT" "${PASSKEY[@]}"
run_phase batches "$TIMEOUT_BATCHES" "$PYTHON" bench/gpu_bench.py batches --out "$OUT" "${BATCHES[@]}"
printf '\n== summary (%s)\n' "$OUT"
cat "$OUT/summary.md"
exit "$FAILED"
