#!/usr/bin/env bash
# Integration: the Spatial Transformer Networks tutorial (tests/export/stn.py: F.affine_grid, F.grid_sample and
# the MNIST classifier) through psd-export and psd: one training step of each variant (zeros, border with
# align_corners, reflection, nearest) against PyTorch's float64 autograd, the input gradient, the tutorial's
# model trained 150 steps on MNIST digits beside PyTorch's own loop (tests/export/check_stn.py says what and to
# which tolerance), and psd-export's refusals.
. "$(dirname "$0")/lib.sh" it_stn
require_py torch grpc
timeout 600 $PY tests/export/check_stn.py "$BUILD" "$tmp" || fail "tests/export/check_stn.py"
echo "it_stn: all checks passed"
