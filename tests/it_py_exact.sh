#!/usr/bin/env bash
# Integration: the Python package (python/psd) against PyTorch's local
# computation of the same batches (tests/python/exact.py), to 1e-5:
#  - mnist_cnn on one psd, then split over two (conv on ps0, fc on ps1):
#    one batch through RemoteStage conv and fc - log-probabilities, loss,
#    the images' gradient, every parameter's gradient, the SGD step - with
#    psd's dropout masks recomputed from their documented seeding
#    (docs/protocol.md); then the whole model as one RemoteStage (its
#    Backward sent with the step on one psd, chained over two);
#  - rnn_lm over three psd (the embedding table sharded by rows over two,
#    decoder and the LSTM's weights on the third), dropout 0: the LSTM as a
#    HostedModule, psd's fused loss with the global-norm clip, then logits
#    here with a scaled step (tests/python/lm_exact.py).
set -euo pipefail
cd "$(dirname "$0")/.."
. tests/python/lib.sh
py_require it_py_exact
DATA=${DATA:-data/mnist}
tmp=$(mktemp -d /tmp/it_py_exact.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
sgd=(--set optimizer.type=sgd --set optimizer.momentum=0 --set optimizer.weight_decay=0)
start_psd "$tmp/psd.log" --config configs/local.yaml --set optimizer.lr=0.03 "${sgd[@]}"
pids+=("$psd"); single=$addr

base=$(( 20000 + RANDOM % 20000 ))
cat >"$tmp/mnist.yaml" <<YAML
cluster: {name: py-exact-mnist}
servers:
  ps0: {address: "127.0.0.1:$base"}
  ps1: {address: "127.0.0.1:$((base + 1))"}
model: {name: mnist_cnn, seed: 1, placement: {conv: ps0/cpu, fc: ps1}}
optimizer: {type: sgd, lr: 0.03}
YAML
cat >"$tmp/lm.yaml" <<YAML
cluster: {name: py-exact-lm}
servers:
  ps0: {address: "127.0.0.1:$((base + 2))"}
  ps1: {address: "127.0.0.1:$((base + 3))"}
  ps2: {address: "127.0.0.1:$((base + 4))"}
model:
  name: rnn_lm
  seed: 1
  placement: {emb: {shards: [ps0, ps1]}, decoder: ps2, rnn: ps2}
  sizes: {ntoken: 50, ninp: 8, nhid: 8, dropout: 0}
optimizer: {type: sgd, lr: 0.5}
YAML
for n in ps0 ps1; do "$BUILD/bin/psd" --config "$tmp/mnist.yaml" --name $n 2>"$tmp/m$n.log" & pids+=($!); done
for n in ps0 ps1 ps2; do "$BUILD/bin/psd" --config "$tmp/lm.yaml" --name $n 2>"$tmp/l$n.log" & pids+=($!); done
timeout 600 $PY tests/python/exact.py --data "$DATA" --mnist "$single" 0.03 --mnist "$tmp/mnist.yaml" 0.03 \
  --lm "$tmp/lm.yaml" 0.5 || { for f in "$tmp"/*.log; do echo "--- $f"; tail -n 5 "$f"; done; exit 1; }
echo "it_py_exact: python/psd equals PyTorch on one psd, MNIST over two and the sharded LM over three: OK"
