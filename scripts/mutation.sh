#!/usr/bin/env bash
# Mutation testing of the modules whose bugs change a number (docs/testing.md): mutmut puts one
# plausible bug at a time into a copy of the package (mutants/) and runs, for each, the tests of
# [tool.mutmut] in pyproject.toml that reach the function it changed. Slow, so not in the default
# suite or CI. Without an argument every configured module runs; with one, that module alone:
#
#   bash scripts/mutation.sh                      # every module in [tool.mutmut] only_mutate
#   bash scripts/mutation.sh bamctl/results/stats.py
#   bash scripts/mutation.sh --results            # the tally so far, per module, from mutants/
#
# MUTATION_WORKERS (default 1) sets how many mutants run at once.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python.sh
MUTMUT="$(dirname "$PYTHON")/mutmut"
[ -x "$MUTMUT" ] || { echo "mutmut is not installed next to $PYTHON (pip install -e '.[dev]')" >&2; exit 2; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export BAMCTL_HYPOTHESIS_PROFILE=mutation  # tests/test_stats_properties.py: no shrinking

if [ "${1:-}" = "--results" ]; then
  exec "$PYTHON" scripts/mutation_tally.py
fi
# each module named becomes the glob of its mutants' names (module.function__mutmut_N); mutmut
# then runs those alone, again, after the stats of which test reaches what (kept in mutants/)
globs=()
for module in "$@"; do
  [ -f "$module" ] || { echo "no such module: $module" >&2; exit 2; }
  module="${module%.py}"
  globs+=("${module//\//.}.*")
done
set -- "${globs[@]}"
# mutmut keeps its map of which test reaches which function between runs and missed tests added
# since (their mutants ran without them): the map is made afresh each time, about 90 s
rm -f mutants/mutmut-stats.json
"$MUTMUT" run --max-children "${MUTATION_WORKERS:-1}" "$@"
"$PYTHON" scripts/mutation_tally.py
