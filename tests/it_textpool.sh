#!/usr/bin/env bash
# Integration: reductions over a dim and the embedding options users write
# (tests/export/textpool.py: a TextCNN with max over time by
# F.max_pool1d(h, h.size(2)), torch.max / min / amax / amin over dims,
# nn.EmbeddingBag of modes mean, sum and max, nn.Embedding's padding_idx)
# through psd-export and psd: one training step each against PyTorch's
# float64 autograd, psd's parameters loading into the module with
# strict=True, 30 steps on one batch tracking PyTorch's own loop, and
# psd-export's refusals (tests/export/check_textpool.py says what and to
# which tolerance).
. "$(dirname "$0")/lib.sh" it_textpool
require_py torch grpc
timeout 600 $PY tests/export/check_textpool.py "$BUILD" "$tmp" || fail "tests/export/check_textpool.py"
echo "it_textpool: all checks passed"
