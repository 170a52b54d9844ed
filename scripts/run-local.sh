#!/usr/bin/env bash
# The main job on one machine: start psd on loopback, train with two
# concurrent ps-train processes (ranks 1 and 2), print each trainer's
# accuracy, stop psd cleanly. Used by `make run`.
#   CONFIG=configs/local.yaml EPOCHS=1 TRAINERS=2 scripts/run-local.sh [extra ps-train flags]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
CONFIG=${CONFIG:-configs/local.yaml}
TRAINERS=${TRAINERS:-2}
EPOCHS=${EPOCHS:-1}
DATA=${DATA:-data/mnist}
logdir=$(mktemp -d /tmp/psd-run.XXXXXX)

"$BUILD/bin/psd" --config "$CONFIG" 2>"$logdir/psd.log" &
psd_pid=$!
cleanup() { kill "$psd_pid" 2>/dev/null || true; }
trap cleanup EXIT
echo "psd started (pid $psd_pid, config $CONFIG, log $logdir/psd.log)"

pids=()
for r in $(seq 1 "$TRAINERS"); do
  "$BUILD/bin/ps-train" --config "$CONFIG" --rank "$r" --world-size $((TRAINERS + 1)) \
      --data "$DATA" --epochs "$EPOCHS" "$@" >"$logdir/trainer$r.log" 2>&1 &
  pids+=($!)
done
# Show the trainers' progress as it happens.
tail -q -n +1 -f "$logdir"/trainer*.log --pid "${pids[-1]}" 2>/dev/null &
tail_pid=$!
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
sleep 0.2; kill "$tail_pid" 2>/dev/null || true; wait "$tail_pid" 2>/dev/null || true

kill -TERM "$psd_pid"
psd_status=0
wait "$psd_pid" || psd_status=$?
trap - EXIT
echo
echo "== summary"
for r in $(seq 1 "$TRAINERS"); do
  grep -h "accuracy" "$logdir/trainer$r.log" || { echo "Rank $r failed:"; tail -n 5 "$logdir/trainer$r.log"; }
done
tail -n 2 "$logdir/psd.log"
if [ "$psd_status" -ne 0 ]; then echo "psd exited with status $psd_status"; status=1; fi
exit $status
