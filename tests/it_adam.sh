#!/usr/bin/env bash
# Integration: psd with optimizer.type adam on rnn_lm (SparseAdam on the
# embedding table, Adam on the decoder), driven by a Python grpcio client
# (tests/adam_client.py) that checks every step against numpy's Adam:
#  1. three steps, then SIGTERM: psd writes a checkpoint on its way out
#     (with encoder.weight.exp_avg etc. in the optimizer file);
#  2. psd restarts from it; two more steps must continue the same numpy
#     run, which they only do when the Adam state and step counts came back.
. "$(dirname "$0")/lib.sh" it_adam
fail_tail=20
require_py grpc grpc_tools numpy

proto_stubs
addr="127.0.0.1:$(free_port)"
args=(--config configs/rnn_lm.yaml --listen "$addr" --checkpoint-dir "$tmp/ckpt"
      --set model.sizes.ntoken=50 --set model.sizes.ninp=8 --set model.sizes.nhid=8 --set model.sizes.dropout=0
      --set optimizer.type=adam --set optimizer.lr=0.01 --set optimizer.momentum=0 --set optimizer.weight_decay=0
      --set server.consistency=hogwild)
client() { PYTHONPATH="$tmp:tests" timeout 120 $PY tests/adam_client.py "$addr" "$@" "$tmp/ref.pkl"; }

"$BUILD/bin/psd" "${args[@]}" 2>"$tmp/psd1.log" & pids+=($!)
client 0 3 || fail "adam steps before the restart"
kill -TERM "${pids[0]}"; wait "${pids[0]}" || fail "psd did not stop cleanly"; pids=()
o="$tmp/ckpt/ckpt-000000000003.optim.safetensors"
[ -f "$o" ] || fail "no checkpoint of version 3: $(ls "$tmp/ckpt")"
grep -aq '"encoder.weight.exp_avg_sq"' "$o" && grep -aq '"psd.optimizer":"adam"' "$o" ||
  fail "$o lacks the Adam state"

"$BUILD/bin/psd" "${args[@]}" 2>"$tmp/psd2.log" & pids+=($!)
client 3 5 || fail "adam steps after the restart"
grep -q "resumed from checkpoint .*ckpt-000000000003.safetensors" "$tmp/psd2.log" || fail "psd did not resume"
kill -TERM "${pids[0]}"; wait "${pids[0]}" || fail "psd did not stop cleanly"; pids=()
echo "it_adam: rnn_lm under Adam/SparseAdam vs numpy, resumed exactly across a checkpointed restart: OK"
