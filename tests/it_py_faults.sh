#!/usr/bin/env bash
# Integration: Python trainers (python/psd, tests/python/fault_trainer.py)
# survive psd's SIGKILL and restart, as tests/it_faults.sh checks for
# ps-train. psd checkpoints every CKPT_STEPS steps; it is killed with -9
# while the trainers are in the middle of their BATCHES batches (held by
# SIGSTOP while psd's count is read and psd killed) and restarted on the
# same address 2 s later, resuming from its newest checkpoint. Each trainer
# must retry with backoff while psd is down, settle its in-flight step, run
# again a batch whose context died with psd, and finish (exit 0).
# Exactly once, counted in contexts (Status.contexts_applied, kept by
# checkpoints; a sync round of two is one model version): the restarted psd
# applies exactly the batches the trainers did not see applied by the first
# - their "batch" lines up to the kill (and replies read after it, before
# the first retry), plus a batch in flight settled as applied on the
# restarted psd (answered from the checkpoint's records: "was applied once").
# One trainer under hogwild (the default) also states it in versions: the
# batches the first psd acknowledged are versions 1..a in order, those the
# restarted psd acknowledged R+1..R+b in order (R: the checkpoint it
# resumed), a + b = BATCHES, and the restarted psd ends at version R + b.
# TRAINERS (1 or 2) trainers, ranks 1.. (two under hogwild run unpaced: a
# BATCHES of 120 keeps both training at the kill); PSD_ARGS adds flags to psd (a
# consistency mode: it_py_faults_sync, it_py_faults_ssp); PY_ARGS adds
# KEY=VALUE overrides to the trainers (a short trainer.rpc_timeout_s);
# LAG_S holds trainer 2 that long before the kill, so that trainer 1 meets
# its deadline under sync or ssp; RESTART_ONLY=1 runs the restart alone.
# Then (not with RESTART_ONLY) psd gone for good: the trainer gives up once
# trainer.retry_max_s is spent, with ps-train's message, instead of hanging.
. "$(dirname "$0")/lib.sh" it_py_faults
. tests/python/lib.sh
py_require it_py_faults
DATA=${DATA:-data/mnist}
BATCHES=${BATCHES:-120}
TRAINERS=${TRAINERS:-1}
CKPT_STEPS=${CKPT_STEPS:-10}
psd= trs=() tr=
on_exit() { for p in $psd ${trs[@]+"${trs[@]}"} $tr; do kill -9 "$p" 2>/dev/null || true; done; }
status() { "$BUILD/bin/ps-train" --server "$addr" --status --set trainer.rpc_timeout_s=5 2>/dev/null; }
field() { sed -n "s/^$1: //p"; }
ckpt=(--config configs/local.yaml --checkpoint-dir "$tmp/ckpt" --set server.checkpoint_every_steps="$CKPT_STEPS"
      --set server.checkpoint_every_s=0 ${PSD_ARGS:-})
have_ckpt() { ls "$tmp/ckpt" 2>/dev/null | grep -qE '^ckpt-[0-9]+\.safetensors$'; }
ranks=$(seq "$TRAINERS")

start_psd "$tmp/psd.log" "${ckpt[@]}" || fail "psd"
# stdout and stderr in one log: its retry and settle messages in order with its batches
for r in $ranks; do
  $PY tests/python/fault_trainer.py "$addr" "$DATA" "$BATCHES" --rank "$r" trainer.rpc_timeout_s=10 \
    trainer.retry_max_s=60 trainer.retry_backoff_s=0.1 trainer.retry_backoff_max_s=1 ${PY_ARGS:-} >"$tmp/t$r.log" 2>&1 &
  trs+=("$!")
done
kill_at=$(( BATCHES / 5 ))
for r in $ranks; do
  until grep -q "^batch $kill_at " "$tmp/t$r.log" && have_ckpt; do
    kill -0 "${trs[r - 1]}" 2>/dev/null || fail "trainer $r ended before the kill: $(tail -n 3 "$tmp/t$r.log")"
    sleep 0.05
  done
done
if [ -n "${LAG_S:-}" ]; then
  # Trainer 2 held alone first, past trainer 1's deadline: under sync trainer
  # 1's step waits in its round, under ssp its Forward is held, and the kill
  # finds it settling or retrying in place.
  kill -STOP "${trs[1]}"; sleep "$LAG_S"
fi
kill -STOP "${trs[@]}"
at_stop=("")  # what each had logged
for r in $ranks; do at_stop+=("$(stat -c %s "$tmp/t$r.log")"); done
for r in $ranks; do  # hogwild does not pace two trainers together: one can finish while the other starts
  grep -q "^fault_trainer: $BATCHES batches" "$tmp/t$r.log" && fail "trainer $r finished before the kill: more BATCHES"
done
s=$(status)
v1=$(echo "$s" | field model_version); c1=$(echo "$s" | field contexts_applied)
kill -9 "$psd"; wait "$psd" 2>/dev/null || true
kill -CONT "${trs[@]}"
f=$(ls "$tmp/ckpt" | grep -E '^ckpt-[0-9]+\.safetensors$' | sort | tail -n 1 || true)
[ -n "$f" ] || fail "no checkpoint before the kill"
echo "psd SIGKILLed at model version $v1, $c1 contexts applied (newest checkpoint $f); restarting in 2 s"
sleep 2
psd=
"$BUILD/bin/psd" --listen "$addr" "${ckpt[@]}" 2>>"$tmp/psd.log" &
psd=$!
rc=0
for r in $ranks; do wait "${trs[r - 1]}" || { rc=1; echo "trainer $r failed:"; tail -n 5 "$tmp/t$r.log"; }; done
trs=()
[ $rc -eq 0 ] || fail "a Python trainer failed"
R=$(sed -n 's/.*resumed from checkpoint .*: model version \([0-9]*\).*/\1/p' "$tmp/psd.log" | tail -n 1)
[ -n "$R" ] || fail "the restarted psd did not resume from a checkpoint"
restored_c=$(sed -n 's/.*records restored (\([0-9]*\) contexts applied).*/\1/p' "$tmp/psd.log" | tail -n 1)
[ -n "$restored_c" ] || fail "the restarted psd did not say it restored its context records"
s=$(status)
final=$(echo "$s" | field model_version); live=$(echo "$s" | field live_contexts)
c2=$(echo "$s" | field contexts_applied)
for r in $ranks; do
  echo "trainer $r: $(grep -m1 '^fault_trainer:' "$tmp/t$r.log"); $(grep -c "retry [0-9]* in" "$tmp/t$r.log") retries" \
       "logged, $(grep -c "; running the batch again" "$tmp/t$r.log") re-run messages," \
       "$(grep -c "was applied once (its Step answers OK)" "$tmp/t$r.log") settled as applied"
  grep -q "retry [0-9]* in" "$tmp/t$r.log" || fail "trainer $r never retried: psd was not down while it trained?"
  head -c "${at_stop[r]}" "$tmp/t$r.log" >"$tmp/t$r.before"; tail -c +"$(( at_stop[r] + 1 ))" "$tmp/t$r.log" >"$tmp/t$r.after"
done
if [ -n "${LAG_S:-}" ] && ! grep -q "DEADLINE_EXCEEDED" "$tmp/t1.before"; then
  fail "trainer 1 met no deadline while trainer 2 was held for $LAG_S s: the short-deadline case was not tested"
fi
echo "restarted psd resumed at version $R ($restored_c contexts applied), ended at $final; live contexts $live"
# Exactly once, in contexts (as it_faults.sh): the batches each trainer saw
# applied by the first psd ("batch N" lines; first_psd_applied, tests/lib.sh).
k1=0
for r in $ranks; do k1=$(( k1 + $(first_psd_applied "^batch [0-9]* " "$tmp/t$r.before" "$tmp/t$r.after") )); done
a2=$(( c2 - restored_c )) total=$(( TRAINERS * BATCHES ))
echo "restarted psd applied $a2 batches itself (of $total; the trainers saw $k1 applied by the first psd, which" \
     "applied $c1 before it died, $restored_c restored from its checkpoint)"
[ "$k1" -le $(( c1 + TRAINERS )) ] || fail "the trainers saw $k1 batches applied by the first psd, it applied $c1: miscounted"
[ "$a2" -le $(( total - k1 )) ] || fail "the restarted psd applied $a2 batches, $total - $k1 were left: a batch applied twice"
[ "$a2" -ge $(( total - k1 )) ] || fail "the restarted psd applied $a2 batches, $total - $k1 were left: batches lost"
[ "$live" = 0 ] || fail "live contexts $live after the trainers finished"
if [ "$TRAINERS" = 1 ] && [ -z "${PSD_ARGS:-}" ]; then
# a: the batches the first psd acknowledged, as counted above (not where the
# versions drop: a checkpoint of the version at the kill has none)
$PY - "$tmp/t1.log" "$BATCHES" "$R" "$final" "$k1" <<'PYEOF' || fail "exactly-once accounting in versions"
import sys
lines = [l.split() for l in open(sys.argv[1]) if l.startswith("batch ")]
B, R, final, a = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
v = [int(l[3]) for l in lines]
assert [int(l[1]) for l in lines] == list(range(B)), "every batch once, in order"
old, new = v[:a], v[a:]
assert old == list(range(1, a + 1)), f"first psd: versions {old[:5]}... are not 1..{a}"
assert new == list(range(R + 1, R + 1 + len(new))), f"restarted psd: versions {new[:5]}... are not {R + 1}.."
assert new, "no batch after the restart: the kill came too late"
assert R <= a + 1, f"resumed at {R}, above the {a} steps acknowledged (+1 in flight)"
assert final == R + len(new), f"restarted psd at {final}, but it acknowledged {len(new)} steps from {R}: a step applied twice or unacknowledged"
print(f"exactly once in versions: {a} batches acknowledged by the first psd (versions 1..{a}), {len(new)} by the "
      f"restarted one (versions {R + 1}..{R + len(new)}), {a + len(new)} = {B} batches; final version {final} = {R} + {len(new)}")
PYEOF
fi
if [ -n "${RESTART_ONLY:-}" ]; then
  echo "it_py_faults: psd SIGKILL+restart survived by $TRAINERS Python trainer(s)${PSD_ARGS:+ (psd $PSD_ARGS)}${PY_ARGS:+ ($PY_ARGS)}, each batch applied once: OK"
  exit 0
fi

# psd gone for good: bounded retries, then a clear error. Properties, not
# timings (the machine may be loaded): the trainer was training when psd
# died (alive, past batch 3; a generous rpc_timeout_s so a slow psd is not
# taken for a dead one), then ended on its own (a hang guard, not a bound)
# with a non-zero exit and the give-up message, after retrying and spending
# its whole retry budget (the "in X s" it reports >= retry_max_s), and its
# last error was psd being unreachable, not a deadline.
kill -TERM "$psd"; wait "$psd" || fail "psd did not stop cleanly"
psd=
start_psd "$tmp/psd2.log" --config configs/local.yaml || fail "psd"
GONE_MAX_S=3
$PY tests/python/fault_trainer.py "$addr" "$DATA" 100000 trainer.rpc_timeout_s=30 trainer.retry_max_s=$GONE_MAX_S \
  trainer.retry_backoff_s=0.1 >"$tmp/gone.log" 2>"$tmp/gone.err" &
tr=$!
until grep -q "^batch 3 " "$tmp/gone.log"; do
  kill -0 "$tr" 2>/dev/null || fail "the trainer ended before psd was killed (gone for good)"
  sleep 0.05
done
kill -0 "$tr" 2>/dev/null || fail "the trainer ended before psd was killed (gone for good)"
kill -9 "$psd"; wait "$psd" 2>/dev/null || true
psd=
for _ in $(seq 6000); do kill -0 "$tr" 2>/dev/null || break; sleep 0.05; done
kill -0 "$tr" 2>/dev/null && fail "the trainer still runs 300 s after psd died for good (retry_max_s $GONE_MAX_S): it hangs"
set +e; wait "$tr"; grc=$?; set -e
tr=
msg=$(grep -m1 'giving up after' "$tmp/gone.err" || true)
echo "trainer after psd died for good: exit $grc: $msg"
[ $grc -ne 0 ] || fail "the trainer exited 0 with psd gone"
[ -n "$msg" ] && <<<"$msg" grep -q "psd did not come back (last error: " || fail "no give-up message"
<<<"$msg" grep -qi "deadline" && fail "the trainer gave up on a deadline, not on psd gone"
$PY - "$msg" "$GONE_MAX_S" <<'PYEOF' || fail "the give-up did not follow the retry budget"
import re, sys
m = re.search(r"giving up after (\d+) retries in ([0-9.]+) s", sys.argv[1])
assert m, "no retry count in the message"
n, used, budget = int(m.group(1)), float(m.group(2)), float(sys.argv[2])
assert n >= 1, "gave up without retrying"
assert used >= budget - 0.1, f"gave up after {used} s, before the {budget} s budget was spent"
PYEOF
echo "it_py_faults: a Python trainer survived psd's SIGKILL + restart, every batch applied once; bounded give-up: OK"
