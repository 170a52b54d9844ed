#!/usr/bin/env bash
# Integration: the real psd on loopback, two concurrent ps-train processes
# for one epoch each; both must reach >= 90% on the 2,000 test digits.
# While they train, test_service runs against the same daemon (malformed
# requests, wrong shapes, unknown contexts must get precise statuses and
# not disturb training). psd must stop cleanly (exit 0) on SIGTERM.
. "$(dirname "$0")/lib.sh" it_train
DATA=${DATA:-data/mnist}
MIN_ACC=${MIN_ACC:-90.0}
port=$(free_port)
addr="127.0.0.1:$port"

"$BUILD/bin/psd" --config configs/local.yaml --listen "$addr" 2>"$tmp/psd.log" &
psd=$!; pids+=("$psd")

for r in 1 2; do
  extra=()
  [ "$r" = 2 ] && extra=(--check-gradients --log-every 50)
  "$BUILD/bin/ps-train" --config configs/local.yaml --server "$addr" --rank "$r" --world-size 3 \
      --data "$DATA" --epochs 1 "${extra[@]}" >"$tmp/t$r.log" 2>&1 &
  eval "t$r=\$!"; pids+=("$!")
done

# Bad input against the live daemon while it trains (once it listens).
wait_port "$port" 120
if ! PSD_ADDR="$addr" "$BUILD/tests/test_service" >"$tmp/service.log" 2>&1; then
  echo "test_service against the running psd failed:"; cat "$tmp/service.log"; exit 1
fi
echo "bad-input checks against the live psd: $(tail -n 1 "$tmp/service.log")"

rc=0
wait "$t1" || rc=1
wait "$t2" || rc=1
for r in 1 2; do
  echo "--- trainer $r"; grep -E "training batch 0 |Training complete|samples/s|accuracy|gradient check batch 0" "$tmp/t$r.log" || true
done
if [ $rc -ne 0 ]; then
  echo "a trainer failed:"; tail -n 20 "$tmp"/t*.log; exit 1
fi
for r in 1 2; do
  acc=$(sed -n 's/^Rank [0-9]* accuracy: \([0-9.]*\)%.*/\1/p' "$tmp/t$r.log")
  [ -n "$acc" ] || { echo "trainer $r printed no accuracy"; exit 1; }
  awk -v a="$acc" -v m="$MIN_ACC" 'BEGIN { exit !(a >= m) }' || { echo "trainer $r accuracy $acc% < $MIN_ACC%"; exit 1; }
done
grep -q "Training complete!" "$tmp/t1.log" && grep -q "Training complete!" "$tmp/t2.log"

kill -TERM "$psd"
set +e
wait "$psd"; prc=$?
set -e
pids=()
[ $prc -eq 0 ] || { echo "psd exited with $prc after SIGTERM"; tail "$tmp/psd.log"; exit 1; }
grep -q "stopped: model version" "$tmp/psd.log" || { echo "psd did not log a clean stop"; tail "$tmp/psd.log"; exit 1; }
echo "psd: $(grep -o 'stopped: .*' "$tmp/psd.log")"
echo "it_train: 2 trainers >= $MIN_ACC% and clean stop: OK"
