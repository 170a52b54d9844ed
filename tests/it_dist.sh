#!/usr/bin/env bash
# Integration: distances to parameters and torch.sign (tests/export/dist.py:
# prototype layers' h.unsqueeze(1) - self.c.unsqueeze(0), self.c[None],
# self.c.view(...), self.c.t(), torch.cdist p 1, 2 and inf (zero distances
# too), F.pairwise_distance and nn.PairwiseDistance, a buffer of fixed
# centres, torch.sign) through psd-export and psd (two through their ONNX
# export): one training step each against PyTorch's float64 autograd, 30
# steps on one batch tracking PyTorch's own loop, a prototypical-network
# classifier trained by ps-train fit, and psd-export's refusals
# (tests/export/check_dist.py says what and to which tolerance).
. "$(dirname "$0")/lib.sh" it_dist
require_py torch grpc
timeout 600 $PY tests/export/check_dist.py "$BUILD" "$tmp" || fail "tests/export/check_dist.py"
echo "it_dist: all checks passed"
