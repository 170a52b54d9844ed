#!/usr/bin/env bash
# Integration: attention written by hand (tests/export/attention.py:
# minGPT's CausalSelfAttention without its mask, in a small classifier)
# through psd against PyTorch, from psd-export's model file and weights
# (--init-from) and from the module's training-mode ONNX export
# (model.onnx): initial values, eval and training forwards, the input
# gradient and every parameter gradient of one step, the new weights, and
# the eval forward after it; then nn.MultiheadAttention through its ONNX
# exports (one MultiheadAttention node) the same way, and its mask,
# cross-attention and need_weights refused (tests/export/check_attention.py
# says what and to which tolerance).
. "$(dirname "$0")/lib.sh" it_attention
require_py torch grpc
timeout 600 $PY tests/export/check_attention.py "$BUILD" "$tmp" || fail "tests/export/check_attention.py"
echo "it_attention: all checks passed"
