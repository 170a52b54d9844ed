#!/usr/bin/env bash
# Integration: a Python trainer (python/psd, tests/python/fault_trainer.py)
# survives psd's SIGKILL and restart, as tests/it_faults.sh checks for
# ps-train. psd checkpoints every CKPT_STEPS steps; it is killed with -9
# while the trainer is in the middle of its BATCHES batches and restarted
# on the same address 2 s later, resuming from its newest checkpoint. The
# trainer must retry with backoff while psd is down, settle its in-flight
# step, run again a batch whose context died with psd, and finish (exit 0).
# Exactly once, from the versions its steps returned (one trainer, so
# psd's versions count its steps): the batches the first psd acknowledged
# are versions 1..a in order, those the restarted psd acknowledged R+1..R+b
# in order (R: the checkpoint it resumed), a + b = BATCHES (every batch
# acknowledged once), and the restarted psd ends at version R + b (no step
# applied that was not acknowledged, none twice).
# Then psd gone for good: the trainer gives up after trainer.retry_max_s
# with ps-train's message instead of hanging.
. "$(dirname "$0")/lib.sh" it_py_faults
. tests/python/lib.sh
py_require it_py_faults
DATA=${DATA:-data/mnist}
BATCHES=${BATCHES:-120}
CKPT_STEPS=${CKPT_STEPS:-10}
psd= tr=
on_exit() { for p in $psd $tr; do kill -9 "$p" 2>/dev/null || true; done; }
status() { "$BUILD/bin/ps-train" --server "$addr" --status --set trainer.rpc_timeout_s=5 2>/dev/null; }
field() { sed -n "s/^$1: //p"; }
ckpt=(--config configs/local.yaml --checkpoint-dir "$tmp/ckpt" --set server.checkpoint_every_steps="$CKPT_STEPS"
      --set server.checkpoint_every_s=0)
have_ckpt() { ls "$tmp/ckpt" 2>/dev/null | grep -qE '^ckpt-[0-9]+\.safetensors$'; }

start_psd "$tmp/psd.log" "${ckpt[@]}" || fail "psd"
port=${addr##*:}
timeout 600 $PY tests/python/fault_trainer.py "$addr" "$DATA" "$BATCHES" trainer.rpc_timeout_s=10 \
  trainer.retry_max_s=60 trainer.retry_backoff_s=0.1 trainer.retry_backoff_max_s=1 >"$tmp/t.log" 2>"$tmp/t.err" &
tr=$!
for _ in $(seq 1200); do
  grep -q "^batch 25 " "$tmp/t.log" && have_ckpt && break
  kill -0 "$tr" 2>/dev/null || fail "the trainer ended before the kill"
  sleep 0.05
done
v1=$(status | field model_version)
kill -9 "$psd"; wait "$psd" 2>/dev/null || true
f=$(ls "$tmp/ckpt" | grep -E '^ckpt-[0-9]+\.safetensors$' | sort | tail -n 1 || true)
[ -n "$f" ] || fail "no checkpoint before the kill"
echo "psd SIGKILLed at model version ~$v1 (newest checkpoint $f); restarting in 2 s"
sleep 2
psd=
"$BUILD/bin/psd" --listen "$addr" "${ckpt[@]}" 2>>"$tmp/psd.log" &
psd=$!
wait "$tr" || fail "the Python trainer failed"
tr=
R=$(sed -n 's/.*resumed from checkpoint .*: model version \([0-9]*\).*/\1/p' "$tmp/psd.log" | tail -n 1)
[ -n "$R" ] || fail "the restarted psd did not resume from a checkpoint"
s=$(status)
final=$(echo "$s" | field model_version); live=$(echo "$s" | field live_contexts)
retries=$(grep -c "retry [0-9]* in" "$tmp/t.err" || true)
reruns=$(grep -c "running the batch again" "$tmp/t.err" || true)
echo "trainer: $(tail -n 1 "$tmp/t.log"); $retries retries logged, $reruns re-run messages"
echo "restarted psd resumed at version $R, ended at $final; live contexts $live"
$PY - "$tmp/t.log" "$BATCHES" "$R" "$final" <<'PYEOF' || fail "exactly-once accounting"
import sys
lines = [l.split() for l in open(sys.argv[1]) if l.startswith("batch ")]
B, R, final = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
v = [int(l[3]) for l in lines]
assert [int(l[1]) for l in lines] == list(range(B)), "every batch once, in order"
a = next((i for i in range(1, B) if v[i] <= v[i - 1]), B)
old, new = v[:a], v[a:]
assert old == list(range(1, a + 1)), f"first psd: versions {old[:5]}... are not 1..{a}"
assert new == list(range(R + 1, R + 1 + len(new))), f"restarted psd: versions {new[:5]}... are not {R + 1}.."
assert new, "no batch after the restart: the kill came too late"
assert R <= a + 1, f"resumed at {R}, above the {a} steps acknowledged (+1 in flight)"
assert final == R + len(new), f"restarted psd at {final}, but it acknowledged {len(new)} steps from {R}: a step applied twice or unacknowledged"
print(f"exactly once: {a} batches acknowledged by the first psd (versions 1..{a}), {len(new)} by the restarted one "
      f"(versions {R + 1}..{R + len(new)}), {a + len(new)} = {B} batches; final version {final} = {R} + {len(new)}")
PYEOF
[ "$retries" -ge 1 ] || fail "the trainer never retried: psd was not down while it trained?"
[ "$live" = 0 ] || fail "live contexts $live after the trainer finished"

# psd gone for good: bounded retries, then a clear error.
kill -TERM "$psd"; wait "$psd" || fail "psd did not stop cleanly"
psd=
start_psd "$tmp/psd2.log" --config configs/local.yaml || fail "psd"
$PY tests/python/fault_trainer.py "$addr" "$DATA" 100000 trainer.rpc_timeout_s=1 trainer.retry_max_s=3 \
  trainer.retry_backoff_s=0.1 >"$tmp/gone.log" 2>"$tmp/gone.err" &
tr=$!
for _ in $(seq 1200); do grep -q "^batch 3 " "$tmp/gone.log" && break; sleep 0.05; done
kill -9 "$psd"; wait "$psd" 2>/dev/null || true
psd=
t0=$(date +%s%N)
set +e; wait "$tr"; grc=$?; set -e
tr=
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
echo "trainer after psd died for good: exit $grc after $ms ms: $(grep -m1 'giving up' "$tmp/gone.err")"
[ $grc -ne 0 ] && [ $ms -le 8000 ] && grep -q "giving up after.*psd did not come back (last error: " "$tmp/gone.err" ||
  fail "expected the trainer to give up within 8 s (retry_max_s 3)"
echo "it_py_faults: a Python trainer survived psd's SIGKILL + restart, every batch applied once; bounded give-up: OK"
