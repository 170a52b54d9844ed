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
echo "it_push_lost: a push after a restart is NOT_FOUND (context_known), the batch runs again, applied once: OK"
