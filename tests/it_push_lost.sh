#!/usr/bin/env bash
# Integration: a PushGradients after a restart does not open a fresh
# context (docs/protocol.md, "Contexts and sequence numbers"). rnn_lm's
# decoder and the trainer-run LSTM (stage rnn) on one psd; a Python trainer
# (tests/python/push_restart.py) runs a batch's decoder Forward and Backward,
# psd is SIGKILLed and restarted on the same address, then the batch steps:
# its push carries context_known, the restarted psd answers NOT_FOUND, and
# the batch is lost (run again: applied), never stepped with the LSTM's
# gradients alone. The restarted psd then counts exactly the contexts the
# trainer saw applied there (Status.contexts_applied, no checkpoint: 2),
# none left open.
# Then ps-train lm over two psd (emb on ps0, decoder and rnn on ps1): ps0
# held (SIGSTOP) while ps1 holds a batch's context - the trainer waits in
# the emb Backward, after the decoder's call and before the push - ps1
# SIGKILLed and restarted, ps0 let go: the push is NOT_FOUND naming
# context_known, the batch runs again (1 batch run again), and the counts
# are exact: ps0 applied every batch, the restarted ps1 those stepped after
# the restart.
. "$(dirname "$0")/lib.sh" it_push_lost
. tests/python/lib.sh
py_require it_push_lost
status() { "$BUILD/bin/ps-train" --server "$addr" --status --set trainer.rpc_timeout_s=5 2>/dev/null; }
field() { sed -n "s/^$1: //p"; }
sizes=(--config configs/rnn_lm.yaml --set model.sizes.ntoken=50 --set model.sizes.ninp=8 --set model.sizes.nhid=8
       --set model.sizes.dropout=0 --set model.backend=ref --log-level warn)
start_psd "$tmp/psd.log" "${sizes[@]}" || fail "psd"
pids+=("$psd")
$PY tests/python/push_restart.py "$addr" "$tmp/go" >"$tmp/trainer.log" 2>&1 &
tr=$!; pids+=("$tr")
wait_for 60 "the trainer's READY" grep -q "^READY" "$tmp/trainer.log"
kill -9 "$psd"; wait "$psd" 2>/dev/null || true
port=${addr##*:}
"$BUILD/bin/psd" --listen "$addr" "${sizes[@]}" 2>>"$tmp/psd.log" &
psd=$!; pids+=("$psd")
wait_for 30 "the restarted psd" status
touch "$tmp/go"
wait "$tr" || fail "the trainer: $(tail -n 3 "$tmp/trainer.log")"
grep -E "^(batch|wire)" "$tmp/trainer.log"
grep -q "^batch 2 lost: .*context_known" "$tmp/trainer.log" || fail "batch 2 was not lost at its push"
s=$(status); c=$(echo "$s" | field contexts_applied); live=$(echo "$s" | field live_contexts)
echo "restarted psd: contexts_applied $c, live $live"
[ "$c" = 2 ] || fail "the restarted psd applied $c contexts; the trainer saw 2 applied there"
[ "$live" = 0 ] || fail "$live contexts left open"
kill "$psd"; wait "$psd" 2>/dev/null || true

# ---- ps-train lm over two psd ----------------------------------------------
[ -f /usr/share/games/fortunes/fortunes ] || { echo "it_push_lost: ps-train part skipped: no fortunes package"; exit 0; }
$PY scripts/fortunes_corpus.py --vocab 200 "$tmp/corpus" >"$tmp/corpus.log" || fail "corpus"
b=$(free_port)
BATCHES=2000
cat >"$tmp/lm.yaml" <<EOF
cluster: {name: it-push-lost}
servers:
  ps0: {address: "127.0.0.1:$b", metrics_listen: "127.0.0.1:$((b + 3))"}
  ps1: {address: "127.0.0.1:$((b + 1))", metrics_listen: "127.0.0.1:$((b + 2))"}
model:
  name: rnn_lm
  seed: 1
  placement: {emb: ps0, decoder: ps1, rnn: ps1}
  sizes: {ntoken: 200, ninp: 16, nhid: 16, dropout: 0}
optimizer: {type: sgd, lr: 1}
trainer: {world_size: 2, batch_size: 4, epochs: 1, data: $tmp/corpus, log_every: 1, rpc_timeout_s: 30,
          retry_max_s: 60, retry_backoff_s: 0.1, retry_backoff_max_s: 0.5}
EOF
"$BUILD/bin/psd" --config "$tmp/lm.yaml" --name ps0 --log-level warn 2>"$tmp/ps0.log" & p0=$!; pids+=("$p0")
"$BUILD/bin/psd" --config "$tmp/lm.yaml" --name ps1 --log-level warn 2>"$tmp/ps1.log" & p1=$!; pids+=("$p1")
st() { "$BUILD/bin/ps-train" --server "127.0.0.1:$1" --status --set trainer.rpc_timeout_s=5 2>/dev/null |
       sed -n "s/^$2: //p"; }
wait_for 30 "ps0" st "$b" live_contexts
wait_for 30 "ps1" st $((b + 1)) live_contexts
"$BUILD/bin/ps-train" lm --config "$tmp/lm.yaml" --bptt 10 --max-batches $BATCHES --no-eval >"$tmp/lm.log" 2>&1 &
tp=$!; pids+=("$tp")
wait_for 60 "the lm trainer's batch 5" grep -q "training batch 5 " "$tmp/lm.log"
held=0
for _ in $(seq 50); do
  kill -STOP "$p0"; sleep 0.3
  # the trainer waits on ps0 with ps1 holding its batch's context: after the decoder's Backward, before the
  # push - not in the Step phase (waiting on ps0's Step, the push done: a restart then loses ps1's step, a
  # partial step, not this test's case): ps1 has answered one Forward (the decoder's, its loss and backward
  # fused) more than PushGradients
  if [ "$(st $((b + 1)) live_contexts)" = 1 ]; then
    calls=$(curl -sf "http://127.0.0.1:$((b + 2))/metrics" | grep '^psd_call_phase_calls_total{method=')
    nb=$(echo "$calls" | sed -n 's/^psd_call_phase_calls_total{method="Forward"} //p')
    np=$(echo "$calls" | sed -n 's/^psd_call_phase_calls_total{method="PushGradients"} //p')
    [ "${nb:-0}" -gt "${np:-0}" ] && { held=1; break; }
  fi
  kill -CONT "$p0"; sleep 0.05
done
[ "$held" = 1 ] || { kill -CONT "$p0"; fail "ps1 never held a batch's context while ps0 was stopped"; }
k=$(grep -c "training batch [0-9]* " "$tmp/lm.log")   # batches done: the held one is batch k
kill -9 "$p1"; wait "$p1" 2>/dev/null || true
"$BUILD/bin/psd" --config "$tmp/lm.yaml" --name ps1 --log-level warn 2>>"$tmp/ps1.log" & p1=$!; pids+=("$p1")
wait_for 30 "the restarted ps1" st $((b + 1)) live_contexts
kill -CONT "$p0"
wait "$tp" || fail "ps-train lm failed"
grep -q "ps1: PushGradients .*NOT_FOUND: PushGradientsRequest.context_known.*running the batch again" "$tmp/lm.log" ||
  fail "the push after ps1's restart was not NOT_FOUND (context_known)"
grep -q "0 partial steps (applied on some servers, lost on others), 1 batches run again" "$tmp/lm.log" ||
  fail "ps-train lm: $(grep 'partial steps' "$tmp/lm.log")"
c0=$(st "$b" contexts_applied); c1=$(st $((b + 1)) contexts_applied)
echo "ps-train lm: batch $k held with ps1's context, ps1 restarted: its push NOT_FOUND (context_known), run again;" \
     "ps0 applied $c0 of $BATCHES, the restarted ps1 $c1 (batches $k..$(( BATCHES - 1 )))"
[ "$c0" = $BATCHES ] || fail "ps0 applied $c0 contexts, the trainer ran $BATCHES batches"
[ "$c1" = $(( BATCHES - k )) ] || fail "the restarted ps1 applied $c1 contexts, $(( BATCHES - k )) were left"
echo "it_push_lost: a push after a restart is NOT_FOUND (context_known), the batch runs again, applied once (Python, ps-train lm): OK"
