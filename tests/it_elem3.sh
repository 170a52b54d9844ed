#!/usr/bin/env bash
# Integration: users' elementwise functions - torch.maximum / minimum (torch.max / min of two tensors), torch.where
# with a comparison of a tensor and a number (or of two tensors), log1p, expm1, sin, cos, torch.flip
# (tests/export/elem3.py) through psd-export and psd (and their ONNX exports through psd's ONNX import): one
# training step each against PyTorch's float64 autograd, psd's parameters loading into the module with
# strict=True, 30 steps on one batch tracking PyTorch's own loop, and psd-export's refusals
# (tests/export/check_elem3.py says what and to which tolerance).
. "$(dirname "$0")/lib.sh" it_elem3
require_py torch grpc
timeout 600 $PY tests/export/check_elem3.py "$BUILD" "$tmp" || fail "tests/export/check_elem3.py"
echo "it_elem3: all checks passed"
