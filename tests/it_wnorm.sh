#!/usr/bin/env bash
# Integration: weight normalisation (nn.utils.weight_norm on Conv1d, Conv2d,
# ConvTranspose2d and Linear; dim 0 and None) through psd-export and psd
# (tests/export/wnorm.py): one training step each against PyTorch's float64
# autograd (weight_g, weight_v and bias gradients), psd's parameters loading
# into the module with strict=True, 30 steps on one batch tracking PyTorch's
# own loop, psd's own weight_g initialisation, and psd-export's refusals of
# spectral_norm, pruning and weight_norm forms psd does not map
# (tests/export/check_wnorm.py says what and to which tolerance).
. "$(dirname "$0")/lib.sh" it_wnorm
require_py torch grpc
timeout 600 $PY tests/export/check_wnorm.py "$BUILD" "$tmp" || fail "tests/export/check_wnorm.py"
echo "it_wnorm: all checks passed"
