#!/usr/bin/env bash
# Integration: models of mixed inputs - int64 categorical ids and float32 dense features (tests/export/multiin.py:
# wide & deep, ids and features interleaved, a history bag beside (2, 3) features) - through psd-export
# (--input-dtype once per input: psd's input the inputs joined flat as float32, the ids exact integers in it, each
# embedding an Embedding of its slice, each feature input a Narrow) and psd: one training step each against
# PyTorch's float64 autograd (the input gradient too), 30 steps tracking PyTorch's own loop, ids that are not
# exact ids or rows refused; ps-train fit reading one array per input (--inputs ids.npy --inputs feats.npy)
# beside PyTorch's own loop, and its refusals (tests/export/check_multiin.py says what and to which tolerance).
. "$(dirname "$0")/lib.sh" it_multiin
require_py torch grpc
timeout 900 $PY tests/export/check_multiin.py "$BUILD" "$tmp" || fail "tests/export/check_multiin.py"
echo "it_multiin: all checks passed"
