#!/usr/bin/env bash
# A real single-node SLURM cluster (slurmctld + slurmd + slurmdbd/MariaDB accounting) for tests and CI.
#
#   bash tests/slurm/cluster.sh install          # apt packages, only what is missing (needs root)
#   bash tests/slurm/cluster.sh start [STATE]    # write confs, start munged/mariadbd/slurmdbd/slurmctld/slurmd
#   bash tests/slurm/cluster.sh status           # exit 0 when a cluster answers (sinfo)
#   bash tests/slurm/cluster.sh stop [STATE]     # stop only the daemons this script started
#
# STATE defaults to $CART_SLURM_STATE or /var/tmp/cart_sweeps-slurm: logs, spool, the MariaDB data dir
# and one PID file per daemon this script started (STATE/pids/NAME.pid). A munged that was already
# running is used and left alone. MariaDB is always a private instance (data dir and socket in STATE,
# --skip-networking), so a system database is never touched.
#
# The confs are written to /etc/slurm (slurm.conf, slurmdbd.conf, cgroup.conf; copies in STATE/etc):
# that is the compiled-in default, so sbatch/sacct/scontrol in any shell, submitit's subprocesses and the
# jobs themselves find the cluster without SLURM_CONF. An /etc/slurm/slurm.conf not written by this script
# is never overwritten (start fails instead) unless CART_SLURM_FORCE=1.
#
# Every failure prints a line starting with "cluster.sh: ERROR" and exits non-zero; on a failed start
# the tails of the daemon logs are printed.
set -Eeuo pipefail
trap 'echo "cluster.sh: ERROR: line $LINENO: \"$BASH_COMMAND\" failed (exit $?)" >&2' ERR

MARK="# written by cart_sweeps tests/slurm/cluster.sh"
CONF_DIR=/etc/slurm
CLUSTER=${CART_SLURM_CLUSTER:-cartsweeps}
PARTITION=${CART_SLURM_PARTITION:-debug}
DB_NAME=slurm_acct_db
DB_USER=slurm
DB_PASS=cartsweeps
PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server)
WAIT_S=${CART_SLURM_WAIT_S:-90}

log() { echo "cluster.sh: $*"; }
die() {
  echo "cluster.sh: ERROR: $*" >&2
  exit 1
}

state_dir() {
  local s=${1:-${CART_SLURM_STATE:-/var/tmp/cart_sweeps-slurm}}
  mkdir -p "$s"
  (cd "$s" && pwd)
}

# ---------------------------------------------------------------------------------------------- install
cmd_install() {
  local missing=() p
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    log "install: all packages present (${PACKAGES[*]})"
    return 0
  fi
  [ "$(id -u)" -eq 0 ] || die "install needs root (missing: ${missing[*]})"
  log "install: apt-get install ${missing[*]}"
  # Keep the packages' maintainer scripts from starting daemons (no systemd here; `start` starts what the
  # tests need and owns it). Only when no policy-rc.d exists already; removed again afterwards.
  local policy=/usr/sbin/policy-rc.d own_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    own_policy=1
  fi
  local rc=0 out
  out=$(mktemp)
  {
    DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${missing[@]}"
  } >"$out" 2>&1 || rc=$?
  [ $own_policy -eq 1 ] && rm -f "$policy"
  if [ $rc -ne 0 ]; then
    tail -n 40 "$out" >&2
    rm -f "$out"
    die "install: apt-get failed (exit $rc) for: ${missing[*]}"
  fi
  rm -f "$out"
  for p in slurmctld slurmd slurmdbd sinfo sacctmgr munged mariadbd mariadb-install-db; do
    command -v "$p" >/dev/null || die "install: $p not on PATH after install"
  done
  log "install: done"
}

# ---------------------------------------------------------------------------------------------- helpers
running() { # pid: exists and is not a zombie (PID 1 here may reap late)
  local st
  st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "$st" != Z ]
}

pid_alive() { # pidfile expected-comm
  local f=$1 comm=$2 pid
  [ -s "$f" ] || return 1
  pid=$(cat "$f")
  running "$pid" || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ]
}

wait_for() { # seconds description command...
  local secs=$1 what=$2
  shift 2
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || return 1
    sleep 0.5
  done
}

ours() { # the slurm.conf in /etc/slurm was written by this script for this state dir
  [ -f "$CONF_DIR/slurm.conf" ] && grep -qF "$MARK" "$CONF_DIR/slurm.conf"
}

node_name() { hostname -s 2>/dev/null || hostname; }

dump_logs() {
  local s=$1 f
  for f in "$s"/log/*.log; do
    [ -f "$f" ] || continue
    echo "----- tail $f" >&2
    tail -n 15 "$f" >&2
  done
}

fail_start() {
  echo "cluster.sh: ERROR: start: $*" >&2
  dump_logs "$STATE"
  exit 1
}

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

mysql_sock() { echo "$STATE/run/mysqld.sock"; }

sql() { mariadb --no-defaults --protocol=socket --socket="$(mysql_sock)" -u root -N -B -e "$1"; }

# ------------------------------------------------------------------------------------------- write confs
write_confs() {
  local node=$1 ctl hw
  ctl=$node
  # "NodeName=x CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=7940"
  hw=$(slurmd -C | head -n1 | sed -E 's/^NodeName=[^ ]+ //')
  [ -n "$hw" ] || fail_start "slurmd -C printed nothing"
  mkdir -p "$STATE/etc" "$CONF_DIR"

  cat >"$STATE/etc/slurm.conf" <<EOF
$MARK
# state dir: $STATE
ClusterName=$CLUSTER
SlurmctldHost=$ctl(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=10
StateSaveLocation=$STATE/spool/ctld
SlurmdSpoolDir=$STATE/spool/slurmd
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=2,sched_interval=2
SlurmctldParameters=preempt_send_user_signal
ReturnToService=2
MailProg=/bin/true
MpiDefault=none
SwitchType=switch/none
KillWait=5
MinJobAge=600
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
JobCompType=jobcomp/none
NodeName=$node NodeAddr=127.0.0.1 $hw State=UNKNOWN
PartitionName=$PARTITION Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF

  cat >"$STATE/etc/slurmdbd.conf" <<EOF
$MARK
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
PidFile=$STATE/run/slurmdbd.pid
LogFile=$STATE/log/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=$DB_USER
StoragePass=$DB_PASS
StorageLoc=$DB_NAME
EOF

  cat >"$STATE/etc/cgroup.conf" <<EOF
$MARK
# slurmd 22.05 always loads a cgroup plugin; v1 does not fail where /sys/fs/cgroup is missing.
CgroupPlugin=cgroup/v1
EOF

  install -m 644 "$STATE/etc/slurm.conf" "$CONF_DIR/slurm.conf"
  install -m 644 "$STATE/etc/cgroup.conf" "$CONF_DIR/cgroup.conf"
  install -m 600 "$STATE/etc/slurmdbd.conf" "$CONF_DIR/slurmdbd.conf"
}

# ------------------------------------------------------------------------------------------- the daemons
start_munge() {
  if munge_ok; then
    log "start: munged already answers (left alone)"
    return 0
  fi
  command -v munged >/dev/null || fail_start "munged not installed (run: cluster.sh install)"
  if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chown munge:munge /etc/munge /etc/munge/munge.key
  chmod 700 /etc/munge
  chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge
  chmod 755 /run/munge
  rm -f /run/munge/munged.pid
  runuser -u munge -- /usr/sbin/munged --force >>"$STATE/log/munged-start.log" 2>&1 ||
    fail_start "munged did not start"
  wait_for 10 "munged" test -s /run/munge/munged.pid || fail_start "munged wrote no pid file"
  cp /run/munge/munged.pid "$STATE/pids/munged.pid"
  wait_for 10 "munge" munge_ok || fail_start "munge -n | unmunge fails"
  log "start: munged started (pid $(cat "$STATE/pids/munged.pid"))"
}

start_mariadb() {
  local sock
  sock=$(mysql_sock)
  if pid_alive "$STATE/pids/mariadbd.pid" mariadbd && sql "select 1" >/dev/null 2>&1; then
    log "start: mariadbd already running"
  else
    command -v mariadbd >/dev/null || fail_start "mariadbd not installed (run: cluster.sh install)"
    if [ ! -d "$STATE/mysql/mysql" ]; then
      rm -rf "$STATE/mysql"
      mkdir -p "$STATE/mysql"
      chown mysql:mysql "$STATE/mysql"
      mariadb-install-db --no-defaults --user=mysql --datadir="$STATE/mysql" \
        --auth-root-authentication-method=socket --skip-test-db >"$STATE/log/mariadb-install-db.log" 2>&1 ||
        fail_start "mariadb-install-db failed (see $STATE/log/mariadb-install-db.log)"
    fi
    chown mysql:mysql "$STATE/run"
    rm -f "$sock"
    # setsid + nohup: the server outlives this script and the caller's session.
    setsid nohup mariadbd --no-defaults --user=mysql --datadir="$STATE/mysql" --socket="$sock" \
      --pid-file="$STATE/run/mariadbd.pid" --skip-networking --log-error="$STATE/log/mariadbd.log" \
      --innodb-lock-wait-timeout=900 --innodb-log-file-size=16M \
      >/dev/null 2>&1 </dev/null &
    echo $! >"$STATE/pids/mariadbd.pid"
    wait_for "$WAIT_S" "mariadbd" sql "select 1" || fail_start "mariadbd does not answer on $sock"
    log "start: mariadbd started (pid $(cat "$STATE/pids/mariadbd.pid"), socket $sock)"
  fi
  sql "CREATE DATABASE IF NOT EXISTS $DB_NAME;
       CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
       GRANT ALL ON $DB_NAME.* TO '$DB_USER'@'localhost'; FLUSH PRIVILEGES;" ||
    fail_start "could not create the slurmdbd database/user"
}

start_slurm_daemon() { # name comm command...
  local name=$1 comm=$2
  shift 2
  if pid_alive "$STATE/pids/$name.pid" "$comm"; then
    log "start: $name already running"
    return 0
  fi
  rm -f "$STATE/run/$name.pid"
  "$@" >>"$STATE/log/$name-start.log" 2>&1 || fail_start "$name exited at start"
  wait_for 15 "$name" test -s "$STATE/run/$name.pid" || fail_start "$name wrote no pid file"
  cp "$STATE/run/$name.pid" "$STATE/pids/$name.pid"
  log "start: $name started (pid $(cat "$STATE/pids/$name.pid"))"
}

node_state() { { sinfo -h -n "$1" -o %t 2>/dev/null || true; } | head -n1; }

node_ready() {
  case "$(node_state "$1")" in
  idle | mix | mixed | alloc | allocated | comp | completing) return 0 ;;
  *) return 1 ;;
  esac
}

cmd_start() {
  STATE=$(state_dir "${1:-}")
  [ "$(id -u)" -eq 0 ] || die "start needs root"
  mkdir -p "$STATE"/{etc,log,run,pids,spool/ctld,spool/slurmd}
  local node
  node=$(node_name)

  if [ -f "$CONF_DIR/slurm.conf" ] && ! ours && [ "${CART_SLURM_FORCE:-0}" != 1 ]; then
    if cmd_status >/dev/null 2>&1; then
      log "start: a cluster not started by this script already answers; using it as it is"
      return 0
    fi
    die "start: $CONF_DIR/slurm.conf was not written by this script; refusing to overwrite (CART_SLURM_FORCE=1 does)"
  fi

  # Idempotent: everything of ours alive and answering -> nothing to do.
  if pid_alive "$STATE/pids/slurmctld.pid" slurmctld && pid_alive "$STATE/pids/slurmd.pid" slurmd &&
    pid_alive "$STATE/pids/slurmdbd.pid" slurmdbd && node_ready "$node"; then
    log "start: cluster already running (state $STATE); nothing to do"
    return 0
  fi

  for p in slurmctld slurmd slurmdbd sinfo sacctmgr munge; do
    command -v "$p" >/dev/null || die "start: $p not installed (run: bash tests/slurm/cluster.sh install)"
  done
  local t0=$SECONDS
  write_confs "$node"
  start_munge
  start_mariadb

  # slurmdbd finds the private MariaDB through its socket (StorageHost=localhost = unix socket).
  MYSQL_UNIX_PORT=$(mysql_sock) start_slurm_daemon slurmdbd slurmdbd slurmdbd
  wait_for "$WAIT_S" "slurmdbd" sacctmgr -n show cluster || fail_start "slurmdbd does not answer (sacctmgr)"
  if ! sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER"; then
    sacctmgr -i add cluster "$CLUSTER" >/dev/null || fail_start "sacctmgr add cluster $CLUSTER failed"
    log "start: registered cluster $CLUSTER in accounting"
  fi

  start_slurm_daemon slurmctld slurmctld slurmctld
  start_slurm_daemon slurmd slurmd slurmd -N "$node"

  local end=$((SECONDS + WAIT_S)) st resumed=0 d
  until node_ready "$node"; do
    for d in slurmdbd slurmctld slurmd; do
      pid_alive "$STATE/pids/$d.pid" "$d" || fail_start "$d exited (see $STATE/log/$d.log)"
    done
    st=$(node_state "$node")
    case "$st" in
    down* | drain* | drng* | fail*)
      if [ $resumed -eq 0 ] && [ $((SECONDS - t0)) -gt 5 ]; then
        scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
        resumed=1
      fi
      ;;
    esac
    [ $SECONDS -lt $end ] || fail_start "node $node not idle after ${WAIT_S}s (state: ${st:-no answer})"
    sleep 0.5
  done
  wait_for 30 "accounting" sacctmgr -n show cluster || fail_start "sacctmgr does not answer"
  log "start: cluster $CLUSTER up in $((SECONDS - t0))s: node $node ($(node_state "$node")), partition $PARTITION, state $STATE"
}

# ----------------------------------------------------------------------------------------------- stop
stop_pid() { # name comm
  local name=$1 comm=$2 f pid i
  f=$STATE/pids/$name.pid
  [ -f "$f" ] || return 0
  if pid_alive "$f" "$comm"; then
    pid=$(cat "$f")
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 100); do
      running "$pid" || break
      sleep 0.1
    done
    if running "$pid"; then
      kill -KILL "$pid" 2>/dev/null || true
      log "stop: $name (pid $pid) killed"
    else
      log "stop: $name (pid $pid) stopped"
    fi
  fi
  rm -f "$f"
}

cmd_stop() {
  STATE=$(state_dir "${1:-}")
  if [ ! -d "$STATE/pids" ] || [ -z "$(ls -A "$STATE/pids" 2>/dev/null)" ]; then
    log "stop: nothing started by this script in $STATE"
    return 0
  fi
  # Our cluster: cancel its jobs so no slurmstepd outlives slurmd.
  if pid_alive "$STATE/pids/slurmctld.pid" slurmctld; then
    local jobs
    jobs=$(squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ') || true
    if [ -n "${jobs// /}" ]; then
      # shellcheck disable=SC2086
      scancel --quiet $jobs 2>/dev/null || true
      log "stop: cancelled jobs $jobs"
    fi
    for _ in $(seq 1 20); do
      pgrep -x slurmstepd >/dev/null || break
      sleep 0.25
    done
  fi
  stop_pid slurmd slurmd
  stop_pid slurmctld slurmctld
  stop_pid slurmdbd slurmdbd
  stop_pid mariadbd mariadbd
  stop_pid munged munged
  log "stop: done (state kept in $STATE)"
}

# --------------------------------------------------------------------------------------------- status
cmd_status() {
  command -v sinfo >/dev/null || {
    echo "cluster.sh: status: sinfo not installed"
    return 1
  }
  local out conf=${SLURM_CONF:-$CONF_DIR/slurm.conf}
  if [ ! -f "$conf" ]; then # sinfo would retry a missing config for 60 s
    echo "cluster.sh: status: no cluster: $conf missing"
    return 1
  fi
  if ! out=$(timeout 15 sinfo -h -o '%P %t %D %C' 2>&1); then
    echo "cluster.sh: status: no cluster answers: $out"
    return 1
  fi
  echo "cluster.sh: status: sinfo answers: $out"
  if timeout 15 sacctmgr -n show cluster >/dev/null 2>&1; then
    echo "cluster.sh: status: accounting (sacctmgr) answers"
  else
    echo "cluster.sh: status: accounting (sacctmgr) does NOT answer: submitit's job states need it"
  fi
}

case "${1:-}" in
install) cmd_install ;;
start) cmd_start "${2:-}" ;;
stop) cmd_stop "${2:-}" ;;
status) cmd_status ;;
*)
  echo "usage: $0 install | start [STATE_DIR] | stop [STATE_DIR] | status" >&2
  exit 2
  ;;
esac
