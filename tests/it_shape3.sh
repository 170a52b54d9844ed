#!/usr/bin/env bash
# Integration: shape forms users write beyond psd's kinds - None-indexing and unsqueeze, nn.Unflatten,
# reductions to one value per sample, torch.logsumexp, torch.cumsum (tests/export/shape3.py: a squeeze-and-excitation
# gate written by hand, per-sample means, sums, maxima and stds, a hand-written log_softmax by logsumexp on values
# whose unshifted exp overflows, cumulative sums along three dims) through psd-export and psd: one training step
# each against PyTorch's float64 autograd, the input gradient, psd's parameters loading into the module with
# strict=True, 20 steps on one batch tracking PyTorch's own loop, and psd-export's refusals
# (tests/export/check_shape3.py says what and to which tolerance).
. "$(dirname "$0")/lib.sh" it_shape3
require_py torch grpc
timeout 600 $PY tests/export/check_shape3.py "$BUILD" "$tmp" || fail "tests/export/check_shape3.py"
echo "it_shape3: all checks passed"
