#!/usr/bin/env bash
# Integration: recommender models of several int64 id inputs (tests/export/ids2.py: NCF's user and item ids, a
# user id and a history of item ids with nn.EmbeddingBag) through psd-export - psd's input the ids joined, each
# embedding an Embedding of its slice (ids_start, ids_shape) - and psd: one training step each against PyTorch's
# float64 autograd, 30 steps tracking PyTorch's own loop, ids out of a slice's table refused, psd-export's
# refusals of other uses of an id input, and ps-train fit learning NCF from (N, 2) int64 .npy ids
# (tests/export/check_ids2.py says what and to which tolerance).
. "$(dirname "$0")/lib.sh" it_ids2
require_py torch grpc
timeout 600 $PY tests/export/check_ids2.py "$BUILD" "$tmp" || fail "tests/export/check_ids2.py"
echo "it_ids2: all checks passed"
