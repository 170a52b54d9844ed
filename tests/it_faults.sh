#!/usr/bin/env bash
# Integration: psd killed with SIGKILL in the middle of training and
# restarted on the same address. Two ps-train processes (80 batches each)
# must retry with backoff (UNAVAILABLE while psd is down), settle their
# in-flight step with the idempotent Step, re-run batches whose context
# died with psd, and finish with exit 0 against the restarted psd.
# Then: with psd gone for good, a trainer gives up once trainer.retry_max_s
# is spent instead of hanging.
#
# Checkpoints: psd runs with a checkpoint every CKPT_STEPS steps and the
# test asserts that the restarted psd resumed from the newest checkpoint and
# that only the steps since that checkpoint were lost: the restarted psd
# applies exactly the batches the trainers did not see applied by the first
# (Status.contexts_applied, an equality: no batch twice, none lost).
# PSD_BIN may point at another build's psd; PSD_ARGS adds flags to psd (a
# consistency mode: it_faults_sync, it_faults_ssp); TRAINER_ARGS adds flags
# to the two trainers; LAG_S holds trainer 2 (SIGSTOP) that long before the
# kill, so that trainer 1 meets its deadline under sync or ssp;
# RESTART_ONLY=1 runs the restart alone (not the task CLI checks before it,
# nor psd gone for good after it). ps-train's default is one call a batch (a
# whole training step in one Forward, whose lost replies settle by Step);
# make test runs it again with --split-calls (it_faults_split: Forward,
# Backward, Step).
. "$(dirname "$0")/lib.sh" it_faults
DATA=${DATA:-data/mnist}
BATCHES=${BATCHES:-80}
PSD_BIN=${PSD_BIN:-$BUILD/bin/psd}
CKPT_STEPS=${CKPT_STEPS:-10}
port=$(free_port)
addr="127.0.0.1:$port"

# The task CLI, before any psd: an unknown task is refused naming the
# tasks; `ps-train mnist --help` lists the task's own flags.
if [ -z "${RESTART_ONLY:-}" ]; then
if "$BUILD/bin/ps-train" nosuchtask --server "$addr" >"$tmp/cli.log" 2>&1; then echo "unknown task accepted"; exit 1; fi
grep -q "unknown task 'nosuchtask'; tasks: mnist" "$tmp/cli.log" || { echo "bad unknown-task error:"; cat "$tmp/cli.log"; exit 1; }
help=$("$BUILD/bin/ps-train" mnist --help); <<<"$help" grep -q -- "--batch-size N" || { echo "ps-train mnist --help lacks --batch-size"; exit 1; }
fi

status() { "$BUILD/bin/ps-train" --server "$addr" --status --set trainer.rpc_timeout_s=5 2>/dev/null; }
field() { sed -n "s/^$1: //p"; }
ckpt=(--checkpoint-dir "$tmp/ckpt" --set server.checkpoint_every_steps="$CKPT_STEPS" --set server.checkpoint_every_s=0)
echo "psd checkpoints every $CKPT_STEPS steps into $tmp/ckpt"
start_psd() {
  "$PSD_BIN" --listen "$addr" --log-level info "${ckpt[@]}" ${PSD_ARGS:-} 2>>"$tmp/psd.log" &
  psd=$!; pids+=("$psd")
  for _ in $(seq 100); do status >/dev/null && return 0; sleep 0.1; done
  echo "psd did not come up"; cat "$tmp/psd.log"; exit 1
}

start_psd
retry=(--set trainer.rpc_timeout_s=10 --set trainer.retry_max_s=60 --set trainer.retry_backoff_s=0.1
       --set trainer.retry_backoff_max_s=1)
# Trainer 1 runs the default task, trainer 2 names it (`ps-train mnist`).
task=("" mnist)
for r in 1 2; do
  "$BUILD/bin/ps-train" ${task[$((r - 1))]} --server "$addr" --rank "$r" --world-size 3 --data "$DATA" \
      --max-batches "$BATCHES" --log-every 1 "${retry[@]}" ${TRAINER_ARGS:-} >"$tmp/t$r.log" 2>&1 &
  eval "t$r=\$!"; pids+=("$!")
done
# Kill psd once both trainers are well into training.
# Also wait for the first checkpoint (psd writes them from its main loop,
# which ticks once a second: fast training can pass step CKPT_STEPS before
# any is on disk).
have_ckpt() { ls "$tmp/ckpt" 2>/dev/null | grep -qE '^ckpt-[0-9]+\.safetensors$'; }
for _ in $(seq 600); do
  grep -q "training batch 15 " "$tmp/t1.log" && grep -q "training batch 15 " "$tmp/t2.log" && have_ckpt && break
  sleep 0.05
done
# The trainers held (SIGSTOP) while psd's version is read and psd killed, so
# no step lands between the two (a checkpoint newer than the version read
# made this test fail on a loaded machine).
if [ -n "${LAG_S:-}" ]; then
  # Trainer 2 held alone first, past trainer 1's deadline: under sync
  # trainer 1's step waits in its round, under ssp its Forward is held, and
  # the kill finds it settling.
  kill -STOP "$t2"; sleep "$LAG_S"
fi
kill -STOP "$t1" "$t2"
at_stop=("" "$(stat -c %s "$tmp/t1.log")" "$(stat -c %s "$tmp/t2.log")")  # what they had logged
s=$(status)
v1=$(echo "$s" | field model_version); c1=$(echo "$s" | field contexts_applied)
kill -9 "$psd"; wait "$psd" 2>/dev/null || true
kill -CONT "$t1" "$t2"
echo "psd SIGKILLed at model version ~$v1; restarting in 2 s"
f=$(ls "$tmp/ckpt" | grep -E '^ckpt-[0-9]+\.safetensors$' | sort | tail -n 1 || true)
[ -n "$f" ] || { echo "no checkpoint written before the kill"; ls -la "$tmp/ckpt"; exit 1; }
newest=$(echo "$f" | sed 's/^ckpt-0*\([0-9][0-9]*\)\.safetensors$/\1/')
sleep 2
start_psd
restored=$(sed -n 's/.*resumed from checkpoint .*: model version \([0-9]*\).*/\1/p' "$tmp/psd.log" | tail -n 1)
[ -n "$restored" ] || { echo "the restarted psd did not say it resumed from a checkpoint"; tail "$tmp/psd.log"; exit 1; }
restored_c=$(sed -n 's/.*records restored (\([0-9]*\) contexts applied).*/\1/p' "$tmp/psd.log" | tail -n 1)
[ -n "$restored_c" ] || { echo "the restarted psd did not say it restored its context records"; tail "$tmp/psd.log"; exit 1; }
echo "restarted psd resumed at model version $restored, $restored_c contexts applied (newest checkpoint: step $newest; ~$(( v1 - restored )) steps since it lost)"
[ "$restored" = "$newest" ] || { echo "resumed at $restored, newest checkpoint is $newest"; exit 1; }
[ "$restored" -gt 0 ] && [ "$restored" -le "$v1" ] || { echo "checkpoint step $restored not in (0, $v1]"; exit 1; }
rc=0
wait "$t1" || rc=1
wait "$t2" || rc=1
for r in 1 2; do
  echo "--- trainer $r: $(grep -c 'retry [0-9]* in' "$tmp/t$r.log") retries logged; $(grep -c '; running the batch again' "$tmp/t$r.log") batches re-run"
  grep -E "retry 1 in|running the batch again|RPC retries|Training complete|accuracy" "$tmp/t$r.log" | head -n 6
done
[ $rc -eq 0 ] || { echo "a trainer failed:"; tail -n 20 "$tmp"/t*.log; exit 1; }
for r in 1 2; do
  grep -q "Training complete!" "$tmp/t$r.log" || { echo "trainer $r did not complete"; exit 1; }
  grep -q "retry [0-9]* in" "$tmp/t$r.log" || { echo "trainer $r never retried: psd was not down while it trained?"; exit 1; }
done
s=$(status)
c2=$(echo "$s" | field contexts_applied); live=$(echo "$s" | field live_contexts)
a2=$(( c2 - restored_c ))  # the batches the restarted psd applied itself
total=$(( 2 * BATCHES ))
# The batches each trainer saw acknowledged by the first psd, and the batch
# in flight at the kill if the restarted psd settled it as applied
# (first_psd_applied, tests/lib.sh).
for r in 1 2; do  # each log before and after the kill (whole files: no early exit in a pipe)
  head -c "${at_stop[$r]}" "$tmp/t$r.log" >"$tmp/t$r.before"; tail -c +"$(( at_stop[r] + 1 ))" "$tmp/t$r.log" >"$tmp/t$r.after"
done
if [ -n "${LAG_S:-}" ] && ! grep -q "DEADLINE_EXCEEDED" "$tmp/t1.before"; then
  echo "trainer 1 met no deadline while trainer 2 was held for $LAG_S s: the short-deadline case was not tested"; exit 1
fi
k1=$(( $(first_psd_applied "training batch [0-9]* " "$tmp/t1.before" "$tmp/t1.after") +
        $(first_psd_applied "training batch [0-9]* " "$tmp/t2.before" "$tmp/t2.after") ))
echo "restarted psd applied $a2 batches itself (of $total; the trainers saw $k1 applied by the first psd, which applied ~$c1 before it died, $restored_c restored from its checkpoint), model version $(echo "$s" | field model_version), live contexts $live"
# Exactly once: each batch's step is applied once, on the psd that applied
# it first, so the restarted psd applied exactly the batches the trainers did
# not see applied by the first psd: total - k1 - never more (a batch applied
# twice), never less (a batch lost). Counted in contexts
# (Status.contexts_applied, kept by checkpoints), not model versions: a sync
# round of two batches is one version.
[ "$k1" -le $(( c1 + 2 )) ] || { echo "the trainers saw $k1 batches applied by the first psd, it applied $c1: miscounted"; exit 1; }
[ "$a2" -le $(( total - k1 )) ] || { echo "the restarted psd applied $a2 batches, $total - $k1 were left: a batch applied twice"; exit 1; }
[ "$a2" -ge $(( total - k1 )) ] || { echo "the restarted psd applied $a2 batches, $total - $k1 were left: batches lost"; exit 1; }
[ "$live" = 0 ] || { echo "live contexts $live after the trainers finished"; exit 1; }

if [ -n "${RESTART_ONLY:-}" ]; then
  echo "it_faults: psd SIGKILL+restart survived by 2 trainers${PSD_ARGS:+ (psd $PSD_ARGS)}${TRAINER_ARGS:+ (ps-train $TRAINER_ARGS)}, each batch applied once, only the steps since the checkpoint lost: OK"
  exit 0
fi

# psd gone for good in the middle of training: bounded retries, then a clear
# error. Properties, not timings (the machine may be loaded): the trainer was
# training when psd died (alive, past batch 3; a generous rpc_timeout_s so a
# slow psd is not taken for a dead one), then ended on its own (a hang guard,
# not a bound) with a non-zero exit and the give-up message, after retrying
# and spending its whole retry budget (the "in X s" it reports >=
# retry_max_s), its last error psd being unreachable, not a deadline.
kill -TERM "$psd"; wait "$psd" || { echo "psd did not stop cleanly"; exit 1; }
start_psd
GONE_MAX_S=3
"$BUILD/bin/ps-train" --server "$addr" --data "$DATA" --log-every 1 --set trainer.rpc_timeout_s=30 \
    --set trainer.retry_max_s=$GONE_MAX_S --set trainer.retry_backoff_s=0.1 >"$tmp/gone.log" 2>&1 &
tg=$!; pids+=("$tg")
gone_fail() { echo "gone for good: $*"; tail "$tmp/gone.log"; exit 1; }
until grep -q "training batch 3 " "$tmp/gone.log"; do
  kill -0 "$tg" 2>/dev/null || gone_fail "the trainer ended before psd was killed"
  sleep 0.05
done
kill -0 "$tg" 2>/dev/null || gone_fail "the trainer ended before psd was killed"
kill -9 "$psd"; wait "$psd" 2>/dev/null || true
for _ in $(seq 6000); do kill -0 "$tg" 2>/dev/null || break; sleep 0.05; done
kill -0 "$tg" 2>/dev/null && gone_fail "the trainer still runs 300 s after psd died (retry_max_s $GONE_MAX_S): it hangs"
set +e
wait "$tg"; grc=$?
set -e
msg=$(grep -m1 'giving up after' "$tmp/gone.log" || true)
echo "trainer after psd died for good: exit $grc: $msg"
[ $grc -ne 0 ] || gone_fail "the trainer exited 0 with psd gone"
<<<"$msg" grep -q "psd did not come back (last error: " || gone_fail "no give-up message"
<<<"$msg" grep -qi "deadline" && gone_fail "the trainer gave up on a deadline, not on psd gone"
echo "$msg" | awk -v b=$GONE_MAX_S '{ if (match($0, /giving up after [0-9]+ retries in [0-9.]+ s/)) {
    split(substr($0, RSTART, RLENGTH), w, " "); n = w[4]; used = w[7] }
  else exit 1
  exit !(n >= 1 && used >= b - 0.1) }' || gone_fail "the give-up did not retry and spend its retry budget first"
pids=()  # stopped above: nothing left to kill
echo "it_faults: psd SIGKILL+restart survived by 2 trainers, resumed from its last checkpoint (lost only the steps since), bounded give-up: OK"
