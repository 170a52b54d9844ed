#!/usr/bin/env bash
# Integration: users' fills and masks - torch.zeros_like / ones_like / full_like(h), h.new_zeros / new_ones /
# new_full of h's shape or (x.size(0), ...) as values (an initial state), x.masked_fill(mask, v) with a mask computed
# from the input (h < 0, m == 0 of a computed 0/1 m, m != 1, ~mask, m.bool(), ids != pad), broadcast or not
# (tests/export/elem4.py) through psd-export and psd (the masks' ONNX export through psd's ONNX import): one training
# step each against PyTorch's float64 autograd, psd's parameters loading into the module with strict=True, 30 steps
# on one batch tracking PyTorch's own loop, and psd-export's refusals (tests/export/check_elem4.py says what and to
# which tolerance).
. "$(dirname "$0")/lib.sh" it_elem4
require_py torch grpc
timeout 600 $PY tests/export/check_elem4.py "$BUILD" "$tmp" || fail "tests/export/check_elem4.py"
echo "it_elem4: all checks passed"
