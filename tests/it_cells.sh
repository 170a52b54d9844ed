#!/usr/bin/env bash
# Integration: recurrent cells called in a Python loop (tests/export/cells.py:
# nn.LSTMCell / nn.GRUCell over 5 steps, stacked, from x.new_zeros /
# torch.zeros_like states or none) through psd-export - a node per call,
# the later calls sharing the first's parameters - and psd: one training
# step each against PyTorch's float64 autograd, psd's parameters loading
# into the module with strict=True, 80 steps on one batch tracking
# PyTorch's own loop (tests/export/check_cells.py says what and to which
# tolerance).
. "$(dirname "$0")/lib.sh" it_cells
require_py torch grpc
timeout 600 $PY tests/export/check_cells.py "$BUILD" "$tmp" || fail "tests/export/check_cells.py"
echo "it_cells: all checks passed"
