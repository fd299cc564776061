#!/usr/bin/env bash
# A Slurm cluster of three virtual nodes (n1, n2, n3) on this one machine, for the real-Slurm tests
# (tests/test_slurm_cluster.py): Debian's slurm-wlm and munge, run as root, every file under one folder.
#
#   slurm/ci/cluster.sh start [DIR]    # munged, slurmctld and one slurmd per node; prints the SLURM_CONF to export
#   slurm/ci/cluster.sh stop [DIR]     # stops them all, removes the nodes' /etc/hosts line
#
# DIR (default /tmp/grpo-slurm-ci) holds slurm.conf, the daemons' logs, spool and state, and munge's key and socket.
# The nodes share this machine's CPUs and memory (slurm-wlm is built with multiple-slurmd support: one slurmd per
# node, each on its own port); their names resolve to 127.0.0.1 through a line of /etc/hosts that `stop` removes.
set -euo pipefail

action=${1:-}
dir=${2:-/tmp/grpo-slurm-ci}
nodes=(n1 n2 n3)
hosts_mark="# grpo-slurm-ci"

die() {
  echo "slurm/ci/cluster.sh: $*" >&2
  exit 1
}

stop_pid_file() {  # stop the daemon whose pid is in $1, waiting until it is gone
  local pid
  [[ -f $1 ]] || return 0
  pid=$(<"$1")
  if [[ $pid =~ ^[0-9]+$ ]] && kill "$pid" 2>/dev/null; then
    for _ in $(seq 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
  fi
  rm -f "$1"
}

stop() {
  for node in "${nodes[@]}"; do
    stop_pid_file "$dir/slurmd-$node.pid"
  done
  stop_pid_file "$dir/slurmctld.pid"
  stop_pid_file "$dir/munged.pid"
  if grep -q "$hosts_mark" /etc/hosts 2>/dev/null; then
    grep -v "$hosts_mark" /etc/hosts >"$dir/hosts" && cat "$dir/hosts" >/etc/hosts
  fi
}

start() {
  ((EUID == 0)) || die "start runs Slurm's daemons as root: run it as root"
  for command in munged slurmctld slurmd sinfo; do
    command -v "$command" >/dev/null || die "no $command: apt-get install slurm-wlm munge"
  done
  stop  # a cluster left by an earlier start
  rm -rf "$dir/ctld" "$dir"/spool-*  # a fresh cluster: no jobs of an earlier one
  mkdir -p "$dir/ctld" "$dir/munge"
  chmod 700 "$dir/munge"
  host=$(hostname -s)
  cpus=$(nproc)
  grep -q "$hosts_mark" /etc/hosts || echo "127.0.0.1 ${nodes[*]} $hosts_mark" >>/etc/hosts

  [[ -f $dir/munge/munge.key ]] || dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$dir/munge/munge.key"
  munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/munged.seed"

  cat >"$dir/slurm.conf" <<CONF
ClusterName=grpo-ci
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=16817
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=10
# cred_expire: a requeued job waits this long before it starts again (Slurm's default: 120 s)
CredType=cred/munge
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=600
# Slurm's defaults, named: SIGTERM, then SIGKILL KillWait seconds later; no preemption configured (the tests send
# what a preemption with a grace time sends: SIGTERM to the job's steps).
KillWait=30
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=17001 CPUs=$cpus State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=17002 CPUs=$cpus State=UNKNOWN
NodeName=n3 NodeHostname=$host NodeAddr=127.0.0.1 Port=17003 CPUs=$cpus State=UNKNOWN
PartitionName=ci Nodes=n[1-3] Default=YES MaxTime=INFINITE State=UP
CONF
  export SLURM_CONF=$dir/slurm.conf
  slurmctld -i
  for node in "${nodes[@]}"; do
    slurmd -N "$node"
  done
  for _ in $(seq 300); do  # the nodes register within seconds
    if [[ $(sinfo --noheader --states=idle --format=%D 2>/dev/null) == "${#nodes[@]}" ]]; then
      echo "export SLURM_CONF=$SLURM_CONF"
      return 0
    fi
    sleep 0.1
  done
  sinfo >&2 || true
  die "the nodes did not come up within 30 s: see $dir/slurmctld.log and $dir/slurmd-*.log"
}

case $action in
  start) start ;;
  stop) stop ;;
  *) die "usage: $0 start|stop [DIR]" ;;
esac
