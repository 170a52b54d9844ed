#!/usr/bin/env bash
# Integration: one module's parameters used at several sites and tied
# weights (docs/models.md "Shared parameters"): a siamese encoder, an
# ALBERT-style block applied three times with one attention module applied
# twice, and an Embedding tied to its decoder Linear (tests/export/shared.py)
# through psd-export and psd against PyTorch's float64 autograd: every
# parameter gradient (summed over the sites), the step, psd's parameters and
# checkpoint loading into the module with load_state_dict(strict=True), a
# restart from the checkpoint, and psd-export's refusals
# (tests/export/check_shared.py says what and to which tolerance).
. "$(dirname "$0")/lib.sh" it_shared
require_py torch grpc
timeout 600 $PY tests/export/check_shared.py "$BUILD" "$tmp" || fail "tests/export/check_shared.py"
echo "it_shared: all checks passed"
