#!/usr/bin/env bash
# Integration: one MNIST batch through the Python package's RemoteStages
# (python/psd) equals PyTorch's local computation of the same batch
# (tests/python/mnist_exact.py): log-probabilities, loss, the images'
# gradient, every parameter's gradient and the SGD step, to 1e-5, with
# psd's dropout masks recomputed from their documented seeding
# (docs/protocol.md); then the whole model as one RemoteStage with its
# Backward sent with the step.
. "$(dirname "$0")/lib.sh" it_py_exact
. tests/python/lib.sh
py_require it_py_exact
DATA=${DATA:-data/mnist}
psd=
on_exit() { [ -z "$psd" ] || kill -9 "$psd" 2>/dev/null; }
start_psd "$tmp/psd.log" --config configs/local.yaml --set optimizer.type=sgd --set optimizer.lr=0.03 \
  --set optimizer.momentum=0 --set optimizer.weight_decay=0
timeout 300 $PY tests/python/mnist_exact.py "$addr" "$DATA" 0.03 || { tail -n 20 "$tmp/psd.log"; exit 1; }
