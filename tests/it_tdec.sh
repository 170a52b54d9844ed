#!/usr/bin/env bash
# Integration: encoder-decoder Transformers (tests/export/tdec.py: the
# translation tutorial's Seq2SeqTransformer around nn.Transformer, its source
# and target split from one id tensor or given as two id inputs;
# nn.TransformerDecoder and nn.TransformerDecoderLayer over a memory of
# another length) through psd-export and psd: one step against PyTorch's
# float64 autograd (every parameter gradient, the input gradient through the
# cross-attention), 30 SGD steps against PyTorch's own loop, the model files'
# node orders, and refusals naming what (tests/export/check_tdec.py says what
# and to which tolerance).
. "$(dirname "$0")/lib.sh" it_tdec
require_py torch grpc
timeout 600 $PY tests/export/check_tdec.py "$BUILD" "$tmp" || fail "tests/export/check_tdec.py"
echo "it_tdec: all checks passed"
