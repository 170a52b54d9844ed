#!/usr/bin/env bash
# Integration: decoders and U-Nets (ConvTranspose2d, Upsample) through psd:
# tests/export/upsampling.py's convolutional autoencoder and small U-Net
# exported by psd-export (and, where psd's ONNX import takes them, through
# their training-mode ONNX export), psd's forwards, input gradient and every
# parameter gradient against float64 autograd, and psd-export's refusals
# (tests/export/check_upsampling.py says what and to which tolerance).
. "$(dirname "$0")/lib.sh" it_upsampling
require_py torch grpc
fail_tail=20
timeout 600 $PY tests/export/check_upsampling.py "$BUILD" "$tmp" || fail "tests/export/check_upsampling.py"
echo "it_upsampling: all checks passed"
