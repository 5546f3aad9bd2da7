#!/usr/bin/env bash
# deploy/slurm.sh - a real local Slurm cluster for shardctl's tests: two slurmd nodes on this machine.
#
#   export SHARDCTL_TEST_SLURM=$(deploy/slurm.sh)      # prints the partition name (stdout), logs on stderr
#   deploy/slurm.sh [up|status|down]                   # default: up
#
# `up` is idempotent and fast when the cluster is already up (it only checks). It installs the Debian
# packages if missing (root, Debian 12), then starts, as plain background daemons (no systemd, no cgroups):
#   munged -> MariaDB (unix socket; an already running server is reused) -> slurmdbd -> slurmctld
#   -> slurmd -N node1, slurmd -N node2   (the Debian build has MULTIPLE_SLURMD: one daemon per node name)
# It exits 0 only when sinfo shows both nodes idle/mix/alloc and `srun -N2 hostname` answers from both.
#
# Partitions (see docs/slurm.md):
#   debug   Default, DefaultTime 10 min, MaxTime 2 h, PriorityTier 1, PreemptMode REQUEUE (preemptible)
#   urgent  PriorityTier 10: a job here preempts (requeues) debug jobs that stand in its way
# Accounting: slurmdbd + MariaDB, so `sacct` reports every job (submitit needs it too).
#
# Knobs: SHARDCTL_SLURM_PARTITION=debug SHARDCTL_SLURM_CLUSTER=shardctl SHARDCTL_SLURM_CPUS=4 (per node,
#        advertised; more than the real cores oversubscribes) SHARDCTL_SLURM_BASE_PORT=17000
#        SHARDCTL_SLURM_WAIT_S=90
set -euo pipefail

ACTION=${1:-up}
NODES=2
PARTITION=${SHARDCTL_SLURM_PARTITION:-debug}
CLUSTER=${SHARDCTL_SLURM_CLUSTER:-shardctl}
CPUS=${SHARDCTL_SLURM_CPUS:-4}
BASE_PORT=${SHARDCTL_SLURM_BASE_PORT:-17000}
WAIT_S=${SHARDCTL_SLURM_WAIT_S:-90}
DB_NAME=slurm_acct_db
DB_USER=slurm
DB_PASS=${SHARDCTL_SLURM_DB_PASS:-slurmdbpass}

ETC=/etc/slurm
RUN=/run/slurm
LOG=/var/log/slurm
LIB=/var/lib/slurm
MUNGE_PID=/run/munge/munged.pid
HOSTS_TAG="# shardctl-slurm"
T0=$SECONDS

log() { echo "slurm.sh [+$((SECONDS - T0))s] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Only ever signal a PID read from a daemon's own pidfile, after checking /proc/PID/comm.
pid_of() {  # pidfile comm -> pid of that live daemon
  local f=$1 c=$2 p
  [ -s "$f" ] || return 1
  p=$(tr -dc '0-9' <"$f")
  [ -n "$p" ] && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$c" ] || return 1
  echo "$p"
}
stop_pidfile() {  # pidfile comm
  local f=$1 c=$2 p end
  if p=$(pid_of "$f" "$c"); then
    log "stopping $c (pid $p)"
    kill -TERM "$p" 2>/dev/null || true
    end=$((SECONDS + 30))
    while [ -e "/proc/$p" ] && [ $SECONDS -lt $end ]; do sleep 0.2; done
    [ -e "/proc/$p" ] && kill -KILL "$p" 2>/dev/null || true
  fi
  rm -f "$f"
}
wait_for() {  # what seconds cmd...
  local what=$1 t=$2 end; shift 2
  end=$((SECONDS + t))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || die "timed out after ${t}s waiting for $what"
    sleep 0.2
  done
}
write_if_changed() {  # path mode owner:group < content ; returns 0 when the file changed
  local f=$1 mode=$2 owner=$3 tmp
  tmp=$(mktemp)
  cat >"$tmp"
  if [ -f "$f" ] && cmp -s "$tmp" "$f"; then rm -f "$tmp"; return 1; fi
  install -m "$mode" -o "${owner%:*}" -g "${owner#*:}" "$tmp" "$f"
  rm -f "$tmp"
  log "wrote $f"
  return 0
}
node_names() { local i; for i in $(seq 1 $NODES); do echo "node$i"; done; }

nodes_ready() {  # every node idle/mix/alloc, and exactly NODES of them
  local states
  states=$(sinfo -h -N -p "$PARTITION" -o '%N %t' 2>/dev/null | sort -u) || return 1
  [ "$(wc -l <<<"$states")" = "$NODES" ] || return 1
  ! awk '$2 !~ /^(idle|mix|alloc)$/ {bad=1} END {exit !bad}' <<<"$states"
}
smoke() {  # both nodes run a step: srun -N2, via the two slurmd daemons
  local out err
  err=$(mktemp)
  out=$(timeout 90 srun -p "$PARTITION" -N2 -t 1 -J shardctl-smoke bash -c 'echo "$SLURMD_NODENAME $(hostname)"' 2>"$err") \
    || { log "srun -N2 failed: $out $(cat "$err")"; rm -f "$err"; return 1; }
  rm -f "$err"
  [ "$(awk '{print $1}' <<<"$out" | sort -u | tr '\n' ' ')" = "node1 node2 " ] \
    || { log "srun -N2 answered from: $out"; return 1; }
  log "srun -N2: $(tr '\n' ';' <<<"$out")"
}
accounting_ok() { sacct -n -X -S now-1hour -o JobID >/dev/null 2>&1; }
daemons_up() {
  pid_of $MUNGE_PID munged >/dev/null && pid_of $RUN/slurmdbd.pid slurmdbd >/dev/null \
    && pid_of $RUN/slurmctld.pid slurmctld >/dev/null \
    && pid_of $RUN/slurmd-node1.pid slurmd >/dev/null && pid_of $RUN/slurmd-node2.pid slurmd >/dev/null
}

install_packages() {
  local b missing=()
  for b in /usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/slurmdbd /usr/bin/sacct /usr/bin/srun \
           /usr/sbin/munged /usr/sbin/mungekey /usr/sbin/mariadbd /usr/bin/mariadb-admin; do
    [ -x "$b" ] || missing+=("$b")
  done
  [ ${#missing[@]} = 0 ] && return 0
  [ "$(id -u)" = 0 ] || die "missing ${missing[*]}; installing them needs root"
  log "installing slurm-wlm slurmdbd munge mariadb-server (missing: ${missing[*]})"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends slurm-wlm slurmdbd munge mariadb-server >/dev/null
}

start_munge() {
  install -d -o munge -g munge -m 0700 /etc/munge /var/log/munge
  install -d -o munge -g munge -m 0711 /var/lib/munge
  install -d -o munge -g munge -m 0755 /run/munge
  if [ ! -s /etc/munge/munge.key ]; then log "creating the munge key"; mungekey --create --keyfile=/etc/munge/munge.key; fi
  chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key
  if ! pid_of $MUNGE_PID munged >/dev/null; then
    log "starting munged"
    runuser -u munge -- /usr/sbin/munged --force   # --force: survive a stale socket from a killed munged
  fi
  wait_for munge "$WAIT_S" bash -c 'munge -n | unmunge'
}

ensure_hosts() {  # node names resolve: torchrun's rendezvous endpoint is the job's first node name
  local line current rest
  line="127.0.0.1 $(node_names | tr '\n' ' ')$HOSTS_TAG"
  current=$(grep -F -- "$HOSTS_TAG" /etc/hosts || true)
  if [ "$current" != "$line" ]; then
    rest=$(grep -vF -- "$HOSTS_TAG" /etc/hosts || true)
    printf '%s\n%s\n' "$rest" "$line" >/etc/hosts   # in place: /etc/hosts may be a bind mount
    log "node names added to /etc/hosts"
  fi
}

start_mariadb() {
  if ! mariadb-admin ping >/dev/null 2>&1; then
    install -d -o mysql -g mysql -m 0755 /run/mysqld
    install -d -o mysql -g adm -m 2750 /var/log/mysql
    if [ ! -d /var/lib/mysql/mysql ]; then
      log "initialising the MariaDB data directory"
      mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
    fi
    log "starting mariadbd (unix socket only)"
    setsid nohup /usr/sbin/mariadbd --user=mysql --skip-networking --pid-file=/run/mysqld/mysqld.pid \
      --log-error=/var/log/mysql/error.log --innodb-buffer-pool-size=512M --innodb-lock-wait-timeout=900 \
      </dev/null >/dev/null 2>&1 &
  fi
  wait_for mariadb "$WAIT_S" mariadb-admin ping
  mariadb -e "CREATE DATABASE IF NOT EXISTS $DB_NAME;
    CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
    ALTER USER '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
    GRANT ALL ON $DB_NAME.* TO '$DB_USER'@'localhost';"
}

write_configs() {  # sets CTL_CHANGED / DBD_CHANGED
  local hw mem node_mem i
  hw=$(slurmd -C | head -n1)
  mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$hw")
  node_mem=$(( mem * 9 / 10 / NODES ))   # every slurmd sees all the RAM: split it
  install -d -m 0755 $ETC
  CTL_CHANGED=0; DBD_CHANGED=0
  {
    cat <<EOF
# Generated by shardctl deploy/slurm.sh: a local two-node cluster for tests. Edits are overwritten.
ClusterName=$CLUSTER
SlurmctldHost=localhost
AuthType=auth/munge
# step credentials live 30 s (default 120): on this one-machine cluster that is ample, and a requeued
# (preempted) job waits that long before it may start again, not two minutes
AuthInfo=cred_expire=30
CredType=cred/munge
SlurmUser=slurm
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$LIB/slurmctld
SlurmdSpoolDir=$LIB/slurmd/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
# no systemd, no cgroups
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
# sacct through slurmdbd
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
# GPUs as a tracked resource, so shardctl export slurm's GrpTRES=gres/gpu=N limits can be recorded
# (the nodes here have none; accounting still knows the type)
GresTypes=gpu
AccountingStorageTRES=gres/gpu
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# preemption: a job in a higher PriorityTier partition requeues the jobs in its way
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
JobRequeue=1
ReturnToService=2
MinJobAge=300
KillWait=5
OverTimeLimit=0
MailProg=/bin/true
InactiveLimit=0
Waittime=0
SlurmdParameters=config_overrides
EOF
    for i in $(seq 1 $NODES); do
      echo "NodeName=node$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((BASE_PORT + i)) CPUs=$CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$node_mem State=UNKNOWN"
    done
    echo "PartitionName=$PARTITION Nodes=ALL Default=YES DefaultTime=00:10:00 MaxTime=02:00:00 PriorityTier=1 PreemptMode=REQUEUE State=UP"
    echo "PartitionName=urgent Nodes=ALL Default=NO DefaultTime=00:10:00 MaxTime=02:00:00 PriorityTier=10 PreemptMode=OFF State=UP"
  } | write_if_changed $ETC/slurm.conf 0644 root:root && CTL_CHANGED=1
  write_if_changed $ETC/slurmdbd.conf 0600 slurm:slurm <<EOF && DBD_CHANGED=1
# Generated by shardctl deploy/slurm.sh
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=slurm
LogFile=$LOG/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=$DB_USER
StoragePass=$DB_PASS
StorageLoc=$DB_NAME
EOF
  [ -f $ETC/plugstack.conf ] || echo "include $ETC/plugstack.conf.d/*.conf" >$ETC/plugstack.conf
  install -d -m 0755 $ETC/plugstack.conf.d
  return 0
}

start_slurmdbd() {
  install -d -o slurm -g slurm -m 0755 $RUN $LOG
  [ "$DBD_CHANGED" = 1 ] && stop_pidfile $RUN/slurmdbd.pid slurmdbd
  if ! pid_of $RUN/slurmdbd.pid slurmdbd >/dev/null; then log "starting slurmdbd"; /usr/sbin/slurmdbd; fi
  wait_for slurmdbd "$WAIT_S" sacctmgr -n show cluster
  if ! sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER"; then
    log "registering cluster $CLUSTER"
    sacctmgr -i add cluster "$CLUSTER" >/dev/null
  fi
}

start_slurm() {
  local f n end resumed=0
  install -d -o slurm -g slurm -m 0755 $LIB/slurmctld $RUN $LOG
  if [ "$CTL_CHANGED" = 1 ]; then  # nodes, ports or partitions may have changed: restart the Slurm side
    for f in $RUN/slurmd-*.pid; do [ -e "$f" ] && stop_pidfile "$f" slurmd; done
    stop_pidfile $RUN/slurmctld.pid slurmctld
  fi
  if ! pid_of $RUN/slurmctld.pid slurmctld >/dev/null; then log "starting slurmctld"; /usr/sbin/slurmctld; fi
  wait_for slurmctld "$WAIT_S" bash -c "scontrol ping | grep -q 'is UP'"
  for n in $(node_names); do
    install -d -m 0755 "$LIB/slurmd/$n"
    if ! pid_of "$RUN/slurmd-$n.pid" slurmd >/dev/null; then log "starting slurmd -N $n"; /usr/sbin/slurmd -N "$n"; fi
  done
  end=$((SECONDS + WAIT_S))
  until nodes_ready; do
    if [ $resumed = 0 ] && [ $((end - SECONDS)) -lt $((WAIT_S - 10)) ]; then
      log "nodes not ready ($(sinfo -h -N -o '%N=%t' | tr '\n' ' ')): scontrol update state=resume"
      for n in $(node_names); do scontrol update nodename="$n" state=resume 2>/dev/null || true; done
      resumed=1
    fi
    [ $SECONDS -lt $end ] || { sinfo -N -l >&2; die "nodes not idle after ${WAIT_S}s"; }
    sleep 0.2
  done
}

do_up() {
  [ "$(id -u)" = 0 ] || die "must run as root (installs packages, writes /etc/slurm, starts daemons)"
  install_packages
  write_configs   # sets CTL_CHANGED / DBD_CHANGED; daemons whose config changed are restarted below
  # Fast path (CI calls this every run): everything running, configs unchanged, nodes ready, a step works.
  if [ "$CTL_CHANGED$DBD_CHANGED" = 00 ] && daemons_up && nodes_ready && accounting_ok && smoke; then
    log "already up"
    echo "$PARTITION"
    return 0
  fi
  start_munge
  ensure_hosts
  start_mariadb
  start_slurmdbd
  start_slurm
  wait_for "sacct" "$WAIT_S" accounting_ok
  smoke || die "srun -N2 hostname did not run on both nodes"
  log "up: $(sinfo -V); partitions: $(sinfo -h -o '%P' | tr '\n' ' '); nodes: $(sinfo -h -N -o '%N=%t' | sort -u | tr '\n' ' ')"
  echo "$PARTITION"
}

do_down() {
  local f jobs
  if pid_of $RUN/slurmctld.pid slurmctld >/dev/null; then
    jobs=$(squeue -h -o %A 2>/dev/null || true)
    # shellcheck disable=SC2086
    [ -n "$jobs" ] && scancel $jobs 2>/dev/null || true
  fi
  for f in $RUN/slurmd-*.pid; do [ -e "$f" ] && stop_pidfile "$f" slurmd; done
  stop_pidfile $RUN/slurmctld.pid slurmctld
  stop_pidfile $RUN/slurmdbd.pid slurmdbd
  log "slurmd, slurmctld and slurmdbd stopped (munged and MariaDB left running)"
}

do_status() {
  local d
  for d in "$MUNGE_PID munged" "$RUN/slurmdbd.pid slurmdbd" "$RUN/slurmctld.pid slurmctld" \
           "$RUN/slurmd-node1.pid slurmd" "$RUN/slurmd-node2.pid slurmd"; do
    # shellcheck disable=SC2086
    set -- $d; printf '%-32s %s\n' "$1" "$(pid_of "$1" "$2" || echo stopped)" >&2
  done
  sinfo -N >&2 || true
}

case "$ACTION" in
  up) do_up ;;
  down) do_down ;;
  status) do_status ;;
  *) die "usage: $0 [up|status|down]" ;;
esac
