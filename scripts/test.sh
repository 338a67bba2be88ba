#!/usr/bin/env bash
# The test suite (README's second command runs it after set-up). Extra arguments go to
# pytest, e.g. `bash scripts/test.sh -m slow` for the slow tests.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python.sh
exec "$PYTHON" -m pytest "$@"
