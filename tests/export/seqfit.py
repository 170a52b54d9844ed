"""Sequence models trained by `ps-train fit --loss cross_entropy --ignore-index N --class-dim last`
(tests/it_seqfit.sh, tests/export/check_seqfit.py), with their padded synthetic data: SeqLM, a next-token language
model of (N, T, V) logits (padding 0), and Translator, the translation tutorial's Seq2SeqTransformer on a copy
task (PAD_IDX 1, teacher forcing)."""
import os
import sys

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tdec import Seq2Seq  # noqa: E402 (the translation tutorial's model, beside this file)

V = 12          # token ids 1..11; 0 is the padding (PAD_IDX)
T = 10          # positions per sequence
E, H = 16, 32


class SeqLM(nn.Module):
    """Embedding + nn.LSTM(batch_first) + Linear: (N, T) ids -> (N, T, V) logits of the next token."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, E)
        self.lstm = nn.LSTM(E, H, batch_first=True)
        self.fc = nn.Linear(H, V)

    def forward(self, x):
        h, _ = self.lstm(self.emb(x))
        return self.fc(h)


def synthetic(g, n):
    """n sequences counting up mod 11 from a random start, of random lengths 3..T, padded with 0: the inputs
    (n, T) and the next-token targets (n, T), 0 (ignored) past each sequence's last token."""
    x = np.zeros((n, T), np.int64)
    y = np.zeros((n, T), np.int64)
    for i in range(n):
        ln, s = int(g.integers(3, T + 1)), int(g.integers(1, V))
        seq = [(s - 1 + k) % (V - 1) + 1 for k in range(ln)]
        x[i, :ln] = seq
        y[i, :ln - 1] = seq[1:]
    return x, y


# The translation tutorial's Seq2SeqTransformer (tests/export/tdec.py's Seq2Seq, the tutorial's masks with
# PAD_IDX 1) returning its (N, T, V) logits, trained on a synthetic copy task with teacher forcing as the tutorial
# does: tgt_input = tgt[:, :-1], tgt_out = tgt[:, 1:], loss_fn = CrossEntropyLoss(ignore_index=PAD_IDX).
PAD_IDX, BOS_IDX, EOS_IDX = 1, 2, 3
S_LEN, T_LEN, TV = 6, 7, 11      # source positions, target positions (tgt_input), vocabulary (ids 4..10 words)


class Translator(Seq2Seq):
    def __init__(self):
        super().__init__(src_len=S_LEN, tgt_len=T_LEN, src_vocab=TV, tgt_vocab=TV, emb_size=16, nhead=2,
                         num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=32, padding=True,
                         pad_id=PAD_IDX)

    def forward(self, ids):
        out = self.translate(ids[:, :self.src_len], ids[:, self.src_len:])
        return out.reshape(out.shape[0], self.tgt_len, TV)


def copy_task(g, n):
    """n source sentences of 2..5 words (ids 4..10) padded with PAD_IDX, the target BOS + the same words + EOS,
    padded: the model's ids (n, S_LEN + T_LEN) = [src, tgt_input] and the labels tgt_out (n, T_LEN)."""
    ids = np.full((n, S_LEN + T_LEN), PAD_IDX, np.int64)
    out = np.full((n, T_LEN), PAD_IDX, np.int64)
    for i in range(n):
        w = g.integers(4, TV, int(g.integers(2, 6)))
        tgt = np.concatenate([[BOS_IDX], w, [EOS_IDX]])
        ids[i, :len(w)] = w
        ids[i, S_LEN:S_LEN + len(tgt) - 1] = tgt[:-1]
        out[i, :len(tgt) - 1] = tgt[1:]
    return ids, out

