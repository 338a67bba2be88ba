#!/usr/bin/env bash
# Stops the Slurm that scripts/slurm/start.sh started in DIR: each daemon by the PID it
# recorded, newest first (never by name, so other Slurm or munge daemons are untouched).
#
#   scripts/slurm/stop.sh [DIR]
set -uo pipefail
DIR=${1:-${TMPDIR:-/tmp}/bamctl-slurm}
[ -s "$DIR/pids" ] || { echo "no Slurm started in $DIR"; exit 0; }
tac "$DIR/pids" | while read -r name pid; do
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
  echo "stopped $name ($pid)"
done
rm -f "$DIR/pids"
