#!/usr/bin/env bash
# A throwaway one-node Slurm on this machine, for the `slurm` tests and for trying
# `bamctl submit --executor slurm` without a cluster. Run as root (slurmd must be able to
# start jobs as their user); needs Debian/Ubuntu's slurm-wlm and munge packages, and
# slurmdbd + mariadb-server for --accounting.
#
#   scripts/slurm/start.sh [--accounting] [DIR]
#
# Everything lives in DIR (default ${TMPDIR:-/tmp}/bamctl-slurm): its own munge key and
# socket, slurm.conf, state, logs and the PID of every daemon started. Nothing under /etc is
# written, so an installed Slurm or munge is left alone; commands find this one through
#   export SLURM_CONF=DIR/slurm.conf       (also written to DIR/env, to source)
# Without --accounting, sacct answers "accounting storage is disabled", as on clusters that
# run without slurmdbd. Slurm 22.05 has no file-based accounting storage any more, so
# --accounting runs MariaDB and slurmdbd too. scripts/slurm/stop.sh DIR stops what this started.
set -euo pipefail

ACCOUNTING=0
if [ "${1:-}" = "--accounting" ]; then ACCOUNTING=1; shift; fi
DIR=${1:-${TMPDIR:-/tmp}/bamctl-slurm}
HOST=$(hostname -s)
CTLD_PORT=${SLURMCTLD_PORT:-6817}
SLURMD_PORT=${SLURMD_PORT:-6818}
DBD_PORT=${SLURMDBD_PORT:-6819}
DB_PORT=${MARIADB_PORT:-33061}

HERE=$(cd "$(dirname "$0")" && pwd)
fail() {  # stops whatever this run already started, so a failed start leaves nothing behind
  echo "scripts/slurm/start.sh: $*" >&2
  [ -s "$DIR/pids" ] && bash "$HERE/stop.sh" "$DIR" >/dev/null
  exit 1
}
[ "$(id -u)" = 0 ] || fail "run as root (slurmd starts each job as its user)"
for tool in munged slurmctld slurmd sbatch; do
  command -v "$tool" >/dev/null || fail "$tool is missing: apt-get install slurm-wlm munge"
done
if [ "$ACCOUNTING" = 1 ]; then
  for tool in slurmdbd mariadbd mariadb-install-db sacctmgr; do
    command -v "$tool" >/dev/null || fail "$tool is missing (--accounting): apt-get install slurmdbd mariadb-server"
  done
fi
if [ -s "$DIR/pids" ]; then
  echo "scripts/slurm/start.sh: $DIR already holds a started Slurm (stop it first: scripts/slurm/stop.sh $DIR)" >&2
  exit 1
fi

mkdir -p "$DIR"/{munge,state,spool,log}
chmod 755 "$DIR"  # MariaDB runs as user mysql and must reach its data folder in here
chmod 700 "$DIR/munge"
: > "$DIR/pids"   # one "name pid" line per daemon started, in start order
started() { echo "$1 $2" >> "$DIR/pids"; }

wait_for() {  # wait_for WHAT SECONDS COMMAND...: until COMMAND succeeds
  local what=$1 seconds=$2; shift 2
  for _ in $(seq "$seconds"); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done
  fail "$what did not come up within ${seconds}s (logs in $DIR/log)"
}

# 1. munge, on its own key and socket (slurm.conf's AuthInfo points every daemon and command at it)
SOCKET=$DIR/munge/munge.socket
if [ ! -s "$DIR/munge/munge.key" ]; then
  if command -v mungekey >/dev/null; then mungekey --create --keyfile="$DIR/munge/munge.key"
  else head -c 1024 /dev/urandom > "$DIR/munge/munge.key"; fi  # munge before 0.5.14 has no mungekey
fi
chmod 600 "$DIR/munge/munge.key"
munged --force --socket="$SOCKET" --key-file="$DIR/munge/munge.key" --pid-file="$DIR/munge/munged.pid" \
  --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed"
wait_for munged 10 test -s "$DIR/munge/munged.pid"
started munged "$(cat "$DIR/munge/munged.pid")"
munge --socket="$SOCKET" -n | unmunge --socket="$SOCKET" >/dev/null || fail "munge does not verify its own credential"

# 2. accounting: MariaDB on 127.0.0.1:$DB_PORT and slurmdbd on $HOST:$DBD_PORT
ACCOUNTING_CONF="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
if [ "$ACCOUNTING" = 1 ]; then
  DB=$DIR/mysql
  if [ ! -d "$DB/mysql" ]; then
    mkdir -p "$DB"; chown mysql:mysql "$DB"
    mariadb-install-db --user=mysql --datadir="$DB" --skip-test-db --auth-root-authentication-method=socket \
      > "$DIR/log/mariadb-install.log" 2>&1 || fail "mariadb-install-db failed (see $DIR/log/mariadb-install.log)"
  fi
  mariadbd --user=mysql --datadir="$DB" --socket="$DB/mysqld.sock" --pid-file="$DB/mariadbd.pid" \
    --bind-address=127.0.0.1 --port="$DB_PORT" > "$DIR/log/mariadbd.log" 2>&1 &
  started mariadbd $!
  wait_for MariaDB 60 mariadb --socket="$DB/mysqld.sock" -e "select 1"
  [ -s "$DIR/dbpass" ] || (umask 077; head -c 18 /dev/urandom | base64 | tr -d '/+=' > "$DIR/dbpass")
  PASS=$(cat "$DIR/dbpass")
  mariadb --socket="$DB/mysqld.sock" -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$PASS';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
  (umask 077; cat > "$DIR/slurmdbd.conf" <<CONF
AuthType=auth/munge
AuthInfo=socket=$SOCKET
DbdHost=$HOST
DbdPort=$DBD_PORT
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$PASS
StorageLoc=slurm_acct_db
PidFile=$DIR/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
CONF
  )
  # slurmdbd reads slurmdbd.conf from the folder of $SLURM_CONF
  SLURM_CONF=$DIR/slurm.conf slurmdbd -D > "$DIR/log/slurmdbd.out" 2>&1 &
  started slurmdbd $!
  ACCOUNTING_CONF="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$HOST
AccountingStoragePort=$DBD_PORT
# for slurmdbd's connections this names the munge socket (AuthInfo does not reach them)
AccountingStoragePass=$SOCKET
JobAcctGatherType=jobacct_gather/linux"
fi

# 3. slurm.conf: one node with this machine's cores and most of its memory
CPUS=$(nproc)
MEMORY=$(( $(awk '/^MemTotal/ {print $2}' /proc/meminfo) / 1024 * 3 / 4 ))
cat > "$DIR/slurm.conf" <<CONF
ClusterName=bamctl
SlurmctldHost=$HOST
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$SOCKET
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# a job that names no --mem would otherwise hold the whole node's memory: one job at a time
DefMemPerCPU=$(( MEMORY / CPUS / 4 ))
ReturnToService=2
$ACCOUNTING_CONF
JobCompType=jobcomp/none
# finished jobs stay visible to scontrol this long (seconds)
MinJobAge=300
KillWait=5
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=$HOST CPUs=$CPUS RealMemory=$MEMORY State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
CONF
echo "export SLURM_CONF=$DIR/slurm.conf" > "$DIR/env"
export SLURM_CONF=$DIR/slurm.conf
if [ "$ACCOUNTING" = 1 ]; then
  wait_for slurmdbd 60 sacctmgr -n list cluster
  sacctmgr -i add cluster bamctl >/dev/null 2>&1 || true  # already there when DIR is reused
fi

# 4. the controller (-i: start from whatever state a previous run left), then the node
slurmctld -D -i > "$DIR/log/slurmctld.out" 2>&1 &
started slurmctld $!
wait_for slurmctld 30 scontrol ping
slurmd -D > "$DIR/log/slurmd.out" 2>&1 &
started slurmd $!
wait_for "the node" 60 sh -c "sinfo -h -o %T | grep -qx idle"
echo "slurm: one node ($HOST, $CPUS CPUs, ${MEMORY} MB), accounting $([ "$ACCOUNTING" = 1 ] && echo on || echo off); export SLURM_CONF=$DIR/slurm.conf"
