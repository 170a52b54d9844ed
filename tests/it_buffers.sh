#!/usr/bin/env bash
# Integration: registered buffers read as values - a sinusoidal positional
# encoding sliced to the sequence, (x - mean) / std normalisation, a
# non-persistent scale, a stepped slice (tests/export/buffers.py) - through
# psd-export and psd as Constant nodes: one training step each against
# PyTorch's float64 autograd, psd's parameters and buffers loading into the
# module with strict=True, 30 steps tracking PyTorch's own loop, psd refusing
# to start without the buffers' values, and psd-export's refusals
# (tests/export/check_buffers.py says what and to which tolerance).
. "$(dirname "$0")/lib.sh" it_buffers
require_py torch grpc
timeout 600 $PY tests/export/check_buffers.py "$BUILD" "$tmp" || fail "tests/export/check_buffers.py"
echo "it_buffers: all checks passed"
