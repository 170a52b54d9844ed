#!/usr/bin/env bash
# Integration: the ops users write beyond psd's kinds - reductions over a dim,
# the embedding options, shape moves
# (tests/export/userops.py: a TextCNN with max over time by
# F.max_pool1d(h, h.size(2)), torch.max / min / amax / amin over dims,
# nn.EmbeddingBag of modes mean, sum and max, nn.Embedding's padding_idx,
# PixelShuffle, padding modules, torch.stack, x.repeat, Softmin) through
# psd-export and psd (and one through its ONNX export): one training step each against PyTorch's
# float64 autograd, psd's parameters loading into the module with
# strict=True, 30 steps on one batch tracking PyTorch's own loop, and
# psd-export's refusals (tests/export/check_userops.py says what and to
# which tolerance).
. "$(dirname "$0")/lib.sh" it_userops
require_py torch grpc
timeout 600 $PY tests/export/check_userops.py "$BUILD" "$tmp" || fail "tests/export/check_userops.py"
echo "it_userops: all checks passed"
