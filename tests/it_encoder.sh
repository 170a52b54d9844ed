#!/usr/bin/env bash
# Integration: nn.TransformerEncoder and nn.TransformerEncoderLayer
# (tests/export/encoder.py: a text classifier - Embedding, TransformerEncoder,
# the mean over the tokens, Linear - batch_first True and False, pre- and
# post-norm, relu and gelu, causal masks, a final LayerNorm; one encoder
# layer called directly) through psd-export and psd, one training step each
# against PyTorch's float64 autograd, psd's parameters loading into the module
# with strict=True; the model files' node orders, dropout, and refusals
# (src_key_padding_mask, other masks, other activations) naming what
# (tests/export/check_encoder.py says what and to which tolerance).
. "$(dirname "$0")/lib.sh" it_encoder
require_py torch grpc
timeout 600 $PY tests/export/check_encoder.py "$BUILD" "$tmp" || fail "tests/export/check_encoder.py"
echo "it_encoder: all checks passed"
