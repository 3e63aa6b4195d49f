#!/usr/bin/env bash
# A real one-node Slurm cluster on this machine, for tests:
#   one_node_cluster.sh start DIR CTLD_PORT SLURMD_PORT   writes DIR/slurm.conf, starts
#                                                         munged, slurmctld, slurmd; waits
#                                                         until the node is idle (60 s)
#   one_node_cluster.sh stop DIR                          stops each daemon by its pid file
# Needs root and Debian's slurmctld, slurmd, slurm-client and munge. Every file
# (key, sockets, state, logs) is under DIR; clients use SLURM_CONF=DIR/slurm.conf.
set -euo pipefail
cmd=$1
dir=$2

stop_pidfile() {  # pidfile: SIGTERM, then SIGKILL after 10 s
  local f=$1 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f" 2>/dev/null || true)
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

if [ "$cmd" = stop ]; then
  # Jobs first: stopping slurmd leaves a job's step daemons and tasks running.
  if [ -f "$dir/slurm.conf" ] && [ -f "$dir/slurmctld.pid" ]; then
    export SLURM_CONF=$dir/slurm.conf
    scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 300); do
      [ -z "$(squeue -h 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
  stop_pidfile "$dir/slurmd.pid"
  stop_pidfile "$dir/slurmctld.pid"
  stop_pidfile "$dir/munged.pid"
  exit 0
fi

[ "$cmd" = start ] || { echo "usage: $0 start DIR CTLD_PORT SLURMD_PORT | stop DIR" >&2; exit 2; }
ctld_port=$3
slurmd_port=$4
node=$(hostname -s)
mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
chmod 700 "$dir/munge"
# munged: a private key, socket, pid, log and seed file under DIR.
dd if=/dev/urandom of="$dir/munge/munge.key" bs=1 count=1024 status=none
chmod 400 "$dir/munge/munge.key"
munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
  --pid-file="$dir/munged.pid" --log-file="$dir/munge/munged.log" \
  --seed-file="$dir/munge/munged.seed"
cat > "$dir/slurm.conf" <<CONF
ClusterName=pstraintest
SlurmctldHost=$node
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SchedulerType=sched/builtin
NodeName=$node CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
slurmctld -f "$dir/slurm.conf"
slurmd -f "$dir/slurm.conf"
export SLURM_CONF=$dir/slurm.conf
for _ in $(seq 600); do
  state=$(sinfo -h -o %t 2>/dev/null || true)
  case "$state" in
    idle|mix|alloc) exit 0 ;;  # "idle*" would be a node not responding
  esac
  sleep 0.1
done
echo "one_node_cluster.sh: the node did not become idle in 60 s (state: ${state:-none});" \
  "logs in $dir" >&2
exit 1
