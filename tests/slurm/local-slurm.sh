# local-slurm.sh - sourced by tests/slurm/run.sh: a real two-node Slurm
# (Debian's slurm-wlm) on this one machine, run from a temp dir and stopped
# by PID. See ../shared/notes/slurm-local.md for the measured facts:
# heterogeneous jobs need >= 2 nodes, so two slurmd (n1, n2) share
# NodeAddr=127.0.0.1 with a port each; het jobs are placed by backfill only
# (bf_interval=1); CPUs=2 per node with oversubscription; auth/none (no munge).
#
#   slurm_up DIR       write DIR/slurm.conf, start slurmctld + slurmd n1, n2,
#                      wait until both nodes are idle; exports SLURM_CONF
#   slurm_down         SIGTERM the daemons, grace, SIGKILL, wait for them
#   sl CMD ARGS...     run a Slurm client command with a timeout (10 s)
#
# Every client call has a timeout and every wait loop a deadline: with
# broken auth, clients hang or fail slowly and slurmd may ignore SIGTERM.

slurm_pids=()

sl() { timeout 10 "$@"; }

slurm_free_port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 20000))
    ss -Hltn "sport = :$p" 2>/dev/null | grep -q . || { echo "$p"; return; }
  done
}

slurm_up() {
  local d=$1 host user p0 p1 p2 i states
  host=$(hostname -s)
  user=$(id -un)
  p0=$(slurm_free_port); p1=$(slurm_free_port); p2=$(slurm_free_port)
  while [ "$p1" = "$p0" ]; do p1=$(slurm_free_port); done
  while [ "$p2" = "$p0" ] || [ "$p2" = "$p1" ]; do p2=$(slurm_free_port); done
  mkdir -p "$d/state" "$d/log" "$d/spool/n1" "$d/spool/n2"
  cat >"$d/slurm.conf" <<EOF
ClusterName=pstest
SlurmctldHost=$host(127.0.0.1)
SlurmUser=$user
SlurmdUser=$user
SlurmctldPort=$p0
AuthType=auth/none
CredType=cred/none
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool/%n
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd-%n.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
KillWait=10
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$p1 CPUs=2 RealMemory=1000 State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=$p2 CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
  export SLURM_CONF=$d/slurm.conf
  slurmctld -D -i >"$d/log/slurmctld.out" 2>&1 & slurm_pids+=($!)
  slurmd -D -N n1 >"$d/log/slurmd-n1.out" 2>&1 & slurm_pids+=($!)
  slurmd -D -N n2 >"$d/log/slurmd-n2.out" 2>&1 & slurm_pids+=($!)
  for i in $(seq 1 60); do
    states=$(sl sinfo -h -N -o %t 2>/dev/null | sort -u | tr '\n' ' ')
    [ "$states" = "idle " ] && { echo "slurm: nodes n1, n2 idle (ctld port $p0, slurmd ports $p1, $p2)"; return 0; }
    sleep 0.5
  done
  echo "slurm: nodes not idle after 30 s (sinfo: '${states:-no answer}'); logs in $d/log" >&2
  return 1
}

slurm_down() {
  local p i alive
  [ ${#slurm_pids[@]} -eq 0 ] && return 0
  for p in "${slurm_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for i in $(seq 1 20); do
    alive=0
    for p in "${slurm_pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.5
  done
  for p in "${slurm_pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${slurm_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  slurm_pids=()
}
