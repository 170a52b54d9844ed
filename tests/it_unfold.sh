#!/usr/bin/env bash
# Integration: F.unfold / nn.Unfold (im2col) and F.fold / nn.Fold (col2im) as users write them - a hand-written
# ViT patch embedding, a custom convolution with an overlap-add, Fold of input columns (tests/export/unfold.py)
# through psd-export and psd: one training step each against PyTorch's float64 autograd (the input gradient
# too), 30 steps on one batch tracking PyTorch's own loop, and psd's refusals of Fold / Unfold geometry that
# does not fit (tests/export/check_unfold.py says what and to which tolerance).
. "$(dirname "$0")/lib.sh" it_unfold
require_py torch grpc
timeout 600 $PY tests/export/check_unfold.py "$BUILD" "$tmp" || fail "tests/export/check_unfold.py"
echo "it_unfold: all checks passed"
