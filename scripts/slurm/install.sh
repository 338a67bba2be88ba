#!/usr/bin/env bash
# Installs what scripts/slurm/start.sh needs, through apt, where it is missing: slurm-wlm and
# munge, and slurmdbd + mariadb-server for --accounting. Needs root (or sudo) and a package
# mirror; exits non-zero, saying why, where it cannot.
set -euo pipefail
missing=()
command -v slurmctld >/dev/null || missing+=(slurm-wlm)
command -v munged >/dev/null || missing+=(munge)
command -v slurmdbd >/dev/null || missing+=(slurmdbd)
command -v mariadbd >/dev/null || missing+=(mariadb-server)
[ ${#missing[@]} -eq 0 ] && exit 0
command -v apt-get >/dev/null || { echo "scripts/slurm/install.sh: no apt-get here; install ${missing[*]} by hand" >&2; exit 1; }
SUDO=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null && sudo -n true 2>/dev/null || { echo "scripts/slurm/install.sh: installing ${missing[*]} needs root" >&2; exit 1; }
  SUDO="sudo -n"
fi
# daemons the packages start on their own do not get in the way: start.sh uses its own munge
# socket and its own ports
export DEBIAN_FRONTEND=noninteractive
timeout 600 $SUDO apt-get update -q >/dev/null
timeout 900 $SUDO apt-get install -y -q "${missing[@]}" >/dev/null
