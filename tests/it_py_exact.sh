#!/usr/bin/env bash
# Integration: the Python package (python/psd) against PyTorch's local
# computation of the same batches (tests/python/exact.py), to 1e-5:
#  - mnist_cnn on one psd, then split over two (conv on ps0, fc on ps1), both
#    at server.max_message_mb 4, so GetGradients answers in pages:
#    one batch through RemoteStage conv and fc - log-probabilities, loss,
#    the images' gradient, every parameter's gradient, the SGD step - with
#    psd's dropout masks recomputed from their documented seeding
#    (docs/protocol.md); then the whole model as one RemoteStage (its
#    Backward sent with the step on one psd, chained over two);
#  - rnn_lm over three psd (the embedding table sharded by rows over two,
#    decoder and the LSTM's weights on the third), dropout 0: the LSTM as a
#    HostedModule, psd's fused loss with the global-norm clip, then logits
#    here with a scaled step (tests/python/lm_exact.py);
#    psd.state_dict of the servers' checkpoint parts (their directory, the
#    list of files or of server directories, ps-ckpt merge's file) equals GetParameters' (a missing part is
#    refused);
#  - ps-train's C client with --check-gradients against the 4 MiB psd: the
#    paged gradients assembled, named and shaped as ListParameters says;
#  - first, the retry and settle rules of docs/protocol.md against scripted
#    servers (tests/python/rules.py: applied, not applied, settled, partial
#    steps, closed rounds, the budget's give-up).
. "$(dirname "$0")/lib.sh" it_py_exact
. tests/python/lib.sh
py_require it_py_exact
DATA=${DATA:-data/mnist}
sgd=(--set optimizer.type=sgd --set optimizer.momentum=0 --set optimizer.weight_decay=0)
# server.max_message_mb 4 (the smallest): MNIST's gradients (4.8 MB, fc1.weight 4.7 MB) come in pages
start_psd "$tmp/psd.log" --config configs/local.yaml --set optimizer.lr=0.03 "${sgd[@]}" --set server.max_message_mb=4
pids+=("$psd"); single=$addr

base=$(free_port)
cat >"$tmp/mnist.yaml" <<YAML
cluster: {name: py-exact-mnist}
servers:
  ps0: {address: "127.0.0.1:$base"}
  ps1: {address: "127.0.0.1:$((base + 1))"}
model: {name: mnist_cnn, seed: 1, placement: {conv: ps0/cpu, fc: ps1}}
optimizer: {type: sgd, lr: 0.03}
server: {max_message_mb: 4}
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
lm=()
for n in ps0 ps1 ps2; do
  "$BUILD/bin/psd" --config "$tmp/lm.yaml" --name $n --set server.checkpoint_dir="$tmp/ckpt" \
    --set server.checkpoint_every_steps=0 --set server.checkpoint_every_s=0 2>"$tmp/l$n.log" &
  pids+=($!); lm+=($!)
done
show() { for f in "$tmp"/*.log; do echo "--- $f"; tail -n 5 "$f"; done; exit 1; }
timeout 600 $PY tests/python/exact.py --data "$DATA" --rules --mnist "$single" 0.03 --mnist "$tmp/mnist.yaml" 0.03 \
  --lm "$tmp/lm.yaml" 0.5 --save "$tmp/lm.pt" || show
# the C client (ps-train --check-gradients) against the same 4 MiB psd: every gradient assembled from its pages
# with ListParameters' name and shape, finite, fc2.bias equal to the trainer's own softmax - onehot
"$BUILD/bin/ps-train" --config configs/local.yaml --server "$single" --set server.max_message_mb=4 --split-calls \
  --check-gradients --max-batches 3 --epochs 1 --no-eval --data "$DATA" >"$tmp/train.out" 2>&1 ||
  { cat "$tmp/train.out"; show; }
n=$(grep -c "gradient check batch .*: 8 gradients OK" "$tmp/train.out")
[ "$n" -ge 1 ] || { cat "$tmp/train.out"; echo "ps-train checked no gradients"; show; }
grep -q "Sent message larger\|RESOURCE_EXHAUSTED" "$tmp"/*.log "$tmp/train.out" &&
  { echo "a message over the limit"; show; }
echo "ok: ps-train's C client assembled 8 paged gradients in $n batches at server.max_message_mb 4"
for p in "${lm[@]}"; do kill -TERM "$p"; done
for p in "${lm[@]}"; do wait "$p" || { echo "an LM psd did not stop cleanly"; show; }; done
parts=("$tmp"/ckpt/ps*/ckpt-*[0-9].safetensors)
[ ${#parts[@]} = 3 ] || { echo "expected 3 checkpoint parts: ${parts[*]}"; show; }
"$BUILD/bin/ps-ckpt" merge -o "$tmp/merged.safetensors" "${parts[@]}" >/dev/null || show
$PY - "$tmp/lm.pt" "$tmp/ckpt" "$tmp/merged.safetensors" "${parts[@]}" <<'PYEOF' || show
import sys, torch, psd
want = torch.load(sys.argv[1])
for what, src in (("the checkpoint directory", sys.argv[2]), ("ps-ckpt merge's file", sys.argv[3]),
                  ("the list of parts", sys.argv[4:]),
                  ("the list of the servers' directories", [p.rsplit("/", 1)[0] for p in sys.argv[4:]])):
    got = psd.state_dict(src)
    assert list(got) == list(want) or sorted(got) == sorted(want), (sorted(got), sorted(want))
    for k in want:
        assert torch.equal(got[k], want[k]), f"{what}: {k} differs from GetParameters'"
try:
    psd.state_dict([p for p in sys.argv[4:] if "/ps1/" not in p])
    raise SystemExit("a missing part was accepted")
except ValueError as e:
    msg = str(e)
    assert "a part is missing" in msg, msg
print("ok: psd.state_dict of the checkpoint parts (directory, list, ps-ckpt merge) equals GetParameters'; "
      f"a missing part: {msg}")
PYEOF
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
pids=()
echo "it_py_exact: python/psd equals PyTorch on one psd, MNIST over two and the sharded LM over three: OK"
