#!/usr/bin/env bash
# Integration: nn.LSTM and nn.GRU run by psd inside a user's graph
# (tests/export/rnn.py: text classifiers - token ids, nn.Embedding, an LSTM
# or GRU of 1 or 2 layers, the last step read as out[:, -1], out[:, -1, :],
# h[-1] or h_n[-1], nn.Linear - and a 2-layer GRU and LSTM over features
# whose whole output sequence feeds a Linear; bidirectional ones of 1 to 4
# layers read as torch.cat((h_n[-2], h_n[-1]), 1), h_n[-2:], h[-1] and
# out[:, -1], and a 2-layer one over features) through psd-export and psd:
# one training step each against PyTorch's float64 autograd, psd's
# parameters loading into the module with strict=True, 60 steps on one batch
# with the loss falling, dropout between layers, ps-train fit training a GRU
# text classifier on .npy files to >= 90 %, and psd-export's refusals
# (tests/export/check_rnn.py says what and to which tolerance).
. "$(dirname "$0")/lib.sh" it_rnn
require_py torch grpc
timeout 600 $PY tests/export/check_rnn.py "$BUILD" "$tmp" || fail "tests/export/check_rnn.py"
echo "it_rnn: all checks passed"
