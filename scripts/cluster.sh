#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for trying and testing `hydra/launcher=slurm`.
#   scripts/cluster.sh up     (re)start munged, slurmctld and slurmd (as root); prints the SLURM_CONF to export
#   scripts/cluster.sh down   stop them, by the pids they wrote
# Needs Debian's slurm-wlm and munge (apt-get install slurm-wlm munge). State, logs and the
# config live in $CLUSTER_DIR (default /tmp/fairaudit-slurm); /etc/slurm is left alone.
set -euo pipefail
DIR=${CLUSTER_DIR:-/tmp/fairaudit-slurm}
CONF=$DIR/slurm.conf
NODE=$(hostname -s)
CPUS=$(nproc)
MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))

write_conf() {
  mkdir -p "$DIR/state" "$DIR/spool" "$DIR/munge"
  cat > "$CONF" <<EOF
ClusterName=fairaudit
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
MaxArraySize=10001
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
}

up() {
  down >/dev/null  # a cluster left from an earlier `up` is replaced
  write_conf
  munged --force --socket="$DIR/munge/munge.socket" --pid-file="$DIR/munged.pid" \
    --log-file="$DIR/munged.log" --seed-file="$DIR/munge/munge.seed"
  export SLURM_CONF=$CONF
  slurmctld -f "$CONF"
  slurmd -f "$CONF"
  for _ in $(seq 60); do
    if sinfo -h -o %t 2>/dev/null | grep -qx idle; then
      echo "SLURM up: node $NODE ($CPUS CPUs, $MEM_MB MB), partition debug"
      echo "export SLURM_CONF=$CONF"
      return 0
    fi
    sleep 1
  done
  echo "error: SLURM did not come up; see $DIR/*.log" >&2
  exit 1
}

stop_pidfile() {
  local file=$1
  [[ -f $file ]] || return 0
  local pid
  pid=$(cat "$file")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  fi
  rm -f "$file"
}

down() {
  stop_pidfile "$DIR/slurmd.pid"
  stop_pidfile "$DIR/slurmctld.pid"
  stop_pidfile "$DIR/munged.pid"
  echo "SLURM down"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
