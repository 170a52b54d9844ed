#!/usr/bin/env bash
# Load test (make test-load): 16 concurrent trainers against one psd on
# loopback for LOAD_SECONDS (default 180). Each of the 16 trainer slots runs
# ps-train (--max-batches BATCHES, then the 2,000-image evaluation) again
# and again until the time is up; every run must succeed. psd's RSS is
# sampled from /proc every second. Checks:
#  - no trainer run fails, no RPC is retried;
#  - model_version == the number of batches trained (each step once);
#  - live contexts return to 0;
#  - peak RSS stays under RSS_LIMIT_MB (default 1536) and the final RSS is
#    not above the peak (no growth once the load is gone).
# Prints peak and final RSS and the throughput.
#
# LR (default 0.005): 16 asynchronous trainers all stepping with the
# tutorial's lr 0.03 make SGD diverge within ~5 batches (loss 2.3 -> 1e6,
# then Inf gradients, which psd's nonfinite policy refuses); 0.005 trains.
. "$(dirname "$0")/../lib.sh" load16
DATA=${DATA:-data/mnist}
LOAD_SECONDS=${LOAD_SECONDS:-180}
TRAINERS=${TRAINERS:-16}
BATCHES=${BATCHES:-15}
RSS_LIMIT_MB=${RSS_LIMIT_MB:-1536}
LR=${LR:-0.005}
port=$(free_port)
addr="127.0.0.1:$port"

"$BUILD/bin/psd" --listen "$addr" --set optimizer.lr="$LR" 2>"$tmp/psd.log" &
psd=$!; pids+=("$psd")
status() { "$BUILD/bin/ps-train" --server "$addr" --status 2>/dev/null; }
for _ in $(seq 100); do status >/dev/null && break; sleep 0.1; done
rss() { sed -n 's/^VmRSS:[[:space:]]*\([0-9]*\) kB/\1/p' /proc/$psd/status; }
rss0=$(rss)

end=$(( $(date +%s) + LOAD_SECONDS ))
slot() {  # rank
  local n=0
  while [ "$(date +%s)" -lt "$end" ]; do
    n=$((n + 1))
    if ! "$BUILD/bin/ps-train" --server "$addr" --rank "$1" --world-size $(( TRAINERS + 1 )) --data "$DATA" \
         --max-batches "$BATCHES" --log-every 1000 --seed "$n" >"$tmp/r$1.$n.log" 2>&1; then
      echo "FAILED: rank $1 run $n"; tail -n 5 "$tmp/r$1.$n.log"; return 1
    fi
    grep -q "Training complete!" "$tmp/r$1.$n.log" || { echo "rank $1 run $n incomplete"; return 1; }
  done
  echo "$n" >"$tmp/runs.$1"
}
echo "load16: $TRAINERS trainers x ${LOAD_SECONDS}s against psd at $addr (psd RSS at start $((rss0 / 1024)) MiB)"
for r in $(seq "$TRAINERS"); do slot "$r" & pids+=("$!"); done
slots=("${pids[@]:1}")
peak=$rss0
t0=$(date +%s)
while kill -0 "${slots[@]}" 2>/dev/null || jobs -r | grep -q slot; do
  r=$(rss); [ "$r" -gt "$peak" ] && peak=$r
  alive=0; for p in "${slots[@]}"; do kill -0 "$p" 2>/dev/null && alive=$((alive + 1)); done
  [ $alive -eq 0 ] && break
  el=$(( $(date +%s) - t0 ))
  [ $(( el % 30 )) -eq 0 ] && echo "  t=${el}s: $alive slots running, psd RSS $(( r / 1024 )) MiB (peak $(( peak / 1024 )))"
  sleep 1
done
rc=0
for p in "${slots[@]}"; do wait "$p" || rc=1; done
[ $rc -eq 0 ] || { echo "load16: a trainer run failed"; exit 1; }
secs=$(( $(date +%s) - t0 ))
runs=0; for r in $(seq "$TRAINERS"); do runs=$(( runs + $(cat "$tmp/runs.$r") )); done
retries=$(cat "$tmp"/r*.log | grep -c "retry [0-9]* in" || true)
accs=$(cat "$tmp"/r*.log | sed -n 's/^Rank [0-9]* accuracy: \([0-9.]*\)%.*/\1/p' | sort -n)
echo "load16: test accuracy of the runs: min $(echo "$accs" | head -n 1)%, max $(echo "$accs" | tail -n 1)%"
s=$(status)
v=$(echo "$s" | sed -n 's/^model_version: //p'); live=$(echo "$s" | sed -n 's/^live_contexts: //p')
sleep 2
final=$(rss)
hwm=$(sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' /proc/$psd/status)
echo "load16: $runs trainer runs ($((runs * BATCHES)) batches of 32, $(( runs * BATCHES * 32 / secs )) samples/s, plus $runs evaluations) in ${secs}s, $retries retries"
echo "load16: psd RSS start $((rss0 / 1024)) MiB, peak $((peak / 1024)) MiB (VmHWM $((hwm / 1024)) MiB), final $((final / 1024)) MiB; model version $v; live contexts $live"
[ "$retries" -eq 0 ] || { echo "load16: RPCs were retried under load"; grep -h "retry [0-9]* in" "$tmp"/r*.log | head; exit 1; }
[ "$v" -eq $(( runs * BATCHES )) ] || { echo "load16: model version $v != batches $(( runs * BATCHES ))"; exit 1; }
[ "$live" = 0 ] || { echo "load16: $live live contexts left"; exit 1; }
[ $(( hwm / 1024 )) -le "$RSS_LIMIT_MB" ] || { echo "load16: peak RSS above ${RSS_LIMIT_MB} MiB"; exit 1; }
[ "$final" -le "$hwm" ] || { echo "load16: final RSS above the peak"; exit 1; }
kill -TERM "$psd"; wait "$psd" || { echo "load16: psd did not stop cleanly"; tail "$tmp/psd.log"; exit 1; }
grep -q "stopped: model version" "$tmp/psd.log" || { echo "load16: psd did not log its clean stop"; tail "$tmp/psd.log"; exit 1; }
pids=()
echo "load16: OK"
