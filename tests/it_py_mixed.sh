#!/usr/bin/env bash
# Integration: a mixed run - one ps-train trainer (rank 1) and one Python
# trainer (examples/mnist_trainer.py on python/psd, rank 2, --one-call:
# RemoteStage.train_step, one call a batch as ps-train's default) train the
# same psd (configs/local.yaml) for one epoch each, concurrently; both must
# reach >= MIN_ACC (90 %) on the 2,000 test digits, and psd must have
# applied one step per batch of the two.
. "$(dirname "$0")/lib.sh" it_py_mixed
. tests/python/lib.sh
py_require it_py_mixed
DATA=${DATA:-data/mnist}
MIN_ACC=${MIN_ACC:-90.0}
psd= t1= t2=
on_exit() { for p in $psd $t1 $t2; do kill -9 "$p" 2>/dev/null || true; done; }

start_psd "$tmp/psd.log" --config configs/local.yaml || fail "psd"
"$BUILD/bin/ps-train" --config configs/local.yaml --server "$addr" --rank 1 --world-size 3 --data "$DATA" \
  --epochs 1 --log-every 50 >"$tmp/c.log" 2>&1 &
t1=$!
timeout 900 $PY examples/mnist_trainer.py --config configs/local.yaml --server "$addr" --rank 2 --data "$DATA" \
  --epochs 1 --log-every 50 --one-call >"$tmp/py.log" 2>&1 &
t2=$!
wait "$t1" || fail "ps-train failed"
t1=
wait "$t2" || fail "the Python trainer failed"
t2=
for f in c py; do
  echo "--- $f: $(grep -E 'samples/s' "$tmp/$f.log") $(grep -E 'accuracy' "$tmp/$f.log")"
  acc=$(accuracy "$tmp/$f.log")
  [ -n "$acc" ] || fail "$f printed no accuracy"
  awk -v a="$acc" -v m="$MIN_ACC" 'BEGIN { exit !(a >= m) }' || fail "$f trainer accuracy $acc% < $MIN_ACC%"
done
v=$("$BUILD/bin/ps-train" --server "$addr" --status 2>/dev/null | sed -n 's/^model_version: //p')
[ "$v" = 500 ] || fail "psd applied $v steps for 2 x 250 batches"
kill -TERM "$psd"; wait "$psd" || fail "psd did not stop cleanly"
psd=
echo "it_py_mixed: ps-train and a Python trainer on one psd, both >= $MIN_ACC%, 500 steps for 500 batches: OK"
