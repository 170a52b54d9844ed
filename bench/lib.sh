# bench/lib.sh - what the bench scripts share (sourced by bench/run.sh and
# bench/trainers.sh): a free-looking port, psd's counters, and waiting for
# psd to answer.
#
#   bench_port                       a random high port (tests/ do the same)
#   psd_snap PID METRICS_ADDR FILE   psd's cost counters now, into FILE:
#     psd_stat t=<s> cpu_s=<utime+stime> minflt=<n> runq_s=<s> ctxsw=<n>
#     (t: CLOCK_MONOTONIC-like seconds (/proc/uptime); runq_s: time psd's
#     threads spent runnable but waiting for a CPU (schedstat); ctxsw:
#     voluntary + involuntary switches of its threads) followed by its
#     /metrics lines psd_call_phase_* and psd_samples_total (the phase
#     accounting, server.profile). Two snapshots give the cost of what ran
#     between them, whatever else the machine ran.
#   wait_psd ADDR                    until a TCP connect to ADDR succeeds (10 s)

bench_port() { echo $(( 20000 + RANDOM % 20000 )); }

psd_snap() {
  local pid=$1 maddr=$2 out=$3
  {
    awk -v tck="$(getconf CLK_TCK)" -v t="$(cut -d' ' -f1 /proc/uptime)" \
      '{printf "psd_stat t=%s cpu_s=%.3f minflt=%d", t, ($14 + $15) / tck, $10}' "/proc/$pid/stat"
    cat /proc/"$pid"/task/*/schedstat 2>/dev/null | awk '{w += $2} END {printf " runq_s=%.6f", w / 1e9}'
    cat /proc/"$pid"/task/*/status 2>/dev/null | awk '/ctxt_switches/ {s += $2} END {printf " ctxsw=%d\n", s}'
    if [ -n "$maddr" ]; then
      curl -sf "http://$maddr/metrics" | grep -E '^psd_call_phase_|^psd_samples_total' || true
    fi
  } >"$out"
}

wait_psd() {
  local host=${1%:*} port=${1##*:}
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}
