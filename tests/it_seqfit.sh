#!/usr/bin/env bash
# Integration: ps-train fit of a sequence model as PyTorch users train one - tests/export/seqfit.py's
# Embedding + nn.LSTM(batch_first) + Linear next-token LM ((N, T, V) logits) on padded sequences, through
# psd-export and a running psd, with `--loss cross_entropy --ignore-index 0 --class-dim last`, against PyTorch's
# own loop with nn.CrossEntropyLoss(ignore_index=0) on logits.reshape(-1, V): the same init and batches, the
# loss of every epoch, the test loss and accuracy; --one-call's fallback and the refusals
# (tests/export/check_seqfit.py says what and to which tolerance).
. "$(dirname "$0")/lib.sh" it_seqfit
require_py torch grpc
timeout 600 $PY tests/export/check_seqfit.py "$BUILD" "$tmp" || fail "tests/export/check_seqfit.py"
echo "it_seqfit: all checks passed"
