"""Modules whose parameters are used at several sites, for tests/it_shared.sh:

  Siamese   one convolutional encoder applied to both images of a sample
            (N, 2, H, W), split by indexing (x[:, 0:1], x[:, 1:2]: one
            channel each); the two embeddings and their difference joined
            into a head
  Repeated  an ALBERT-style block (Linear, LayerNorm, Tanh) applied three
            times, `for _ in range(k): x = x + self.block(x)`, and one
            attention module applied twice
  TiedLM    an Embedding whose (V, E) weight is the decoder Linear's
            (self.decoder.weight = self.encoder.weight, as PyTorch's
            word_language_model ties them)
"""
import torch
import torch.nn as nn


class Siamese(nn.Module):
    def __init__(self, hw=6, emb=8, classes=3):
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                                     nn.Linear(4 * hw * hw, emb))
        self.head = nn.Linear(3 * emb, classes)

    def forward(self, x):
        a = self.encoder(x[:, 0:1])
        b = self.encoder(x[:, 1:2])
        return self.head(torch.cat([a, b, a - b], dim=1))


class Repeated(nn.Module):
    def __init__(self, d=8, k=3, classes=4, seq=5, attention=True):
        super().__init__()
        self.k = k
        self.inp = nn.Linear(d, d)
        self.block = nn.Sequential(nn.Linear(d, d), nn.LayerNorm(d), nn.Tanh())
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True) if attention else None
        self.out = nn.Linear(seq * d, classes)

    def forward(self, x):
        x = self.inp(x)
        for _ in range(self.k):
            x = x + self.block(x)
            if self.attn is not None and _ < 2:
                x = x + self.attn(x, x, x, need_weights=False)[0]
        return self.out(x.flatten(1))


class TiedLM(nn.Module):
    def __init__(self, vocab=20, emb=8):
        super().__init__()
        self.encoder = nn.Embedding(vocab, emb)
        self.proj = nn.Linear(emb, emb)
        self.decoder = nn.Linear(emb, vocab)
        self.decoder.weight = self.encoder.weight

    def forward(self, ids):
        return self.decoder(torch.tanh(self.proj(self.encoder(ids)))).flatten(1)
