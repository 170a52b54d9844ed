#!/usr/bin/env bash
# Integration: modules with BatchNorm called at several sites
# (docs/models.md "Shared parameters"; tests/export/sharebn.py: a
# SimCLR-style siamese CNN with BatchNorm2d and BatchNorm1d, a triplet
# network whose BatchNorm1d has affine=False and momentum=None, a
# recurrent-depth block applied three times) through psd-export and psd:
# one step against float64 autograd (the running statistics PyTorch's:
# each call's batch statistics folded in call order), four more SGD steps
# beside PyTorch's own loop (outputs, gradients, parameters, running
# statistics and num_batches_tracked at each), and psd's checkpoint loading
# into the module with strict=True, its buffers psd's, its eval forward
# psd's (tests/export/check_sharebn.py says what and to which tolerance).
. "$(dirname "$0")/lib.sh" it_sharebn
require_py torch grpc
timeout 600 $PY tests/export/check_sharebn.py "$BUILD" "$tmp" || fail "tests/export/check_sharebn.py"
echo "it_sharebn: all checks passed"
