"""Sequence models trained by `ps-train fit --loss cross_entropy --ignore-index 0 --class-dim last`
(tests/it_seqfit.sh, tests/export/check_seqfit.py): a next-token language model of (N, T, V) logits, and its
padded synthetic data."""
import numpy as np
import torch
import torch.nn as nn

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
