# local-cluster.sh - sourced by scripts/run-local.sh, run-rl.sh and run-lm.sh:
# psd on this machine plus N concurrent ps-train processes whose output is
# shown as it happens. The caller sets BUILD and logdir (and `set -e`).
#   psd_start CONFIG [psd flags...]    start psd, log in $logdir/psd.log; stopped on exit; its web
#                                      dashboard on DASHBOARD (127.0.0.1:9464; "" = none) when free
#   workers_run N NAME CMD...          run N copies of CMD with "--rank r --world-size N+1"
#                                      appended, output in $logdir/NAMEr.log; returns 1 if one failed
#   psd_stop                           SIGTERM psd, wait; returns psd's exit status

psd_start() {
  local cfg=$1; shift
  local dash=${DASHBOARD-127.0.0.1:9464} extra=() note=""
  if [ -n "$dash" ]; then
    if (exec 3<>"/dev/tcp/${dash%:*}/${dash##*:}") 2>/dev/null; then
      note="; $dash is taken, so no dashboard (DASHBOARD=HOST:PORT picks another)"
    else
      extra=(--metrics-listen "$dash")
      note="; dashboard: http://$dash/"
    fi
  fi
  "$BUILD/bin/psd" --config "$cfg" "${extra[@]}" "$@" 2>"$logdir/psd.log" &
  psd_pid=$!
  trap 'kill "$psd_pid" 2>/dev/null || true' EXIT
  echo "psd started (pid $psd_pid, config $cfg${*:+, $*}, log $logdir/psd.log)$note"
}

workers_run() {
  local n=$1 name=$2; shift 2
  local pids=() r p rc=0
  for r in $(seq 1 "$n"); do
    "$@" --rank "$r" --world-size $((n + 1)) >"$logdir/$name$r.log" 2>&1 &
    pids+=($!)
  done
  tail -q -n +1 -f "$logdir"/"$name"*.log --pid "${pids[-1]}" 2>/dev/null &
  local tail_pid=$!
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  sleep 0.2; kill "$tail_pid" 2>/dev/null || true; wait "$tail_pid" 2>/dev/null || true
  return $rc
}

psd_stop() {
  local rc=0
  kill -TERM "$psd_pid"
  wait "$psd_pid" || rc=$?
  trap - EXIT
  return $rc
}
