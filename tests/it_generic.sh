#!/usr/bin/env bash
# Integration: psd as a host of any model, driven by a Python grpcio client
# generated from proto/ps.proto at test time (python3-grpc-tools), with
# every answer checked against numpy (tests/generic_client.py):
#  1. the shipped configs/cartpole.yaml and configs/rnn_lm.yaml pass
#     --check-config;
#  2. rnn_lm (small sizes, dropout 0, SGD): stage-addressed Forward with
#     int64 ids, typed-input refusals, a retried Forward answered from the
#     record, decoder input gradients only when asked, one Backward covering
#     two forwards, accumulated gradients, and a step that changes exactly
#     the embedding rows the batch touched;
#  3. cartpole_policy under consistency sync (2 workers, sum): two observers
#     of five Forwards each get one summed step with the same version and
#     round; of three contexts of one round two fill it, the third joins
#     the next;
#  4. hogwild, sync (6 workers) and ssp (staleness 1) with more trainer
#     threads than psd's 2 server threads: every step applied exactly once,
#     every sync round one step, no fast trainer beyond the ssp bound.
. "$(dirname "$0")/lib.sh" it_generic
fail_tail=20
require_py grpc grpc_tools numpy

proto_stubs

for c in configs/cartpole.yaml configs/rnn_lm.yaml; do
  out=$("$BUILD/bin/psd" --check-config "$c") || fail "--check-config $c: $out"
done

start() {  # name, config, extra args... ; sets addr
  local name=$1 cfg=$2; shift 2
  local port=$(free_port)
  addr="127.0.0.1:$port"
  "$BUILD/bin/psd" --config "$cfg" --listen "$addr" "$@" 2>"$tmp/$name.log" &
  pids+=($!)
}

start lm configs/rnn_lm.yaml --set model.sizes.ntoken=50 --set model.sizes.ninp=8 --set model.sizes.nhid=8 \
  --set model.sizes.dropout=0 --set optimizer.type=sgd --set optimizer.lr=0.5 --set optimizer.momentum=0 \
  --set optimizer.weight_decay=0 --set server.consistency=hogwild
PYTHONPATH="$tmp" timeout 120 $PY tests/generic_client.py lm "$addr" 0.5 || fail "rnn_lm checks"

start sync configs/cartpole.yaml --set server.consistency=sync --set server.sync_workers=2 \
  --set server.sync_reduce=sum --set server.sync_timeout_s=60 --set optimizer.type=sgd --set optimizer.lr=0.01
PYTHONPATH="$tmp" timeout 120 $PY tests/generic_client.py sync "$addr" || fail "sync checks"

# Each mode with more trainers than psd has threads: exactly-once application.
start hog configs/cartpole.yaml --set server.threads=2 --set server.consistency=hogwild --set optimizer.type=sgd
PYTHONPATH="$tmp" timeout 120 $PY tests/generic_client.py modes "$addr" hogwild || fail "hogwild exactly once"
start bsp configs/cartpole.yaml --set server.threads=2 --set server.consistency=sync --set server.sync_workers=6 \
  --set server.sync_timeout_s=120 --set optimizer.type=sgd
PYTHONPATH="$tmp" timeout 180 $PY tests/generic_client.py modes "$addr" sync || fail "sync exactly once"
start ssp configs/cartpole.yaml --set server.threads=2 --set server.consistency=ssp --set server.max_staleness=1 \
  --set optimizer.type=sgd
PYTHONPATH="$tmp" timeout 180 $PY tests/generic_client.py modes "$addr" ssp || fail "ssp bound"

for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
for p in "${pids[@]}"; do wait "$p" || fail "psd $p did not stop cleanly"; done
pids=()
echo "it_generic: rnn_lm stages and cartpole sync rounds from a Python grpcio client: OK"
