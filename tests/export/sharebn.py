"""Modules with BatchNorm called at several sites, for tests/it_sharebn.sh
(docs/models.md "Shared parameters"): PyTorch's module holds one set of
running statistics, which each call's training forward updates in call
order; eval reads them at every site.

  SiameseBN       SimCLR-style: one CNN encoder (Conv2d, BatchNorm2d, ReLU,
                  MaxPool2d, Conv2d, BatchNorm2d, ReLU, Flatten, Linear,
                  BatchNorm1d) applied to both views of a sample, stacked
                  on the channels (N, 2C, H, W): encoder(x[:, :C]),
                  encoder(x[:, C:]); the two embeddings and their
                  difference into a head
  Triplet         one encoder (Linear, BatchNorm1d(affine=False,
                  momentum=None): buffers and no parameters, a cumulative
                  average) applied to anchor, positive and negative
  RecurrentDepth  one block (Linear, BatchNorm1d(momentum=0.3), Tanh)
                  applied three times, x = x + block(x)
"""
import torch
import torch.nn as nn


class SiameseBN(nn.Module):
    def __init__(self, c=3, hw=8, emb=16, classes=3):
        super().__init__()
        self.c = c
        self.encoder = nn.Sequential(
            nn.Conv2d(c, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
            nn.Linear(8 * (hw // 2) * (hw // 2), emb), nn.BatchNorm1d(emb))
        self.head = nn.Linear(3 * emb, classes)

    def forward(self, x):
        a = self.encoder(x[:, :self.c])
        b = self.encoder(x[:, self.c:])
        return self.head(torch.cat([a, b, a - b], dim=1))


class Triplet(nn.Module):
    def __init__(self, d=10, emb=6, classes=3):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d, 12), nn.BatchNorm1d(12, affine=False, momentum=None), nn.ReLU(),
                                     nn.Linear(12, emb))
        self.head = nn.Linear(5 * emb, classes)

    def forward(self, x):
        a, p, n = self.encoder(x[:, 0]), self.encoder(x[:, 1]), self.encoder(x[:, 2])
        return self.head(torch.cat([a, p, n, a - p, a - n], dim=1))


class RecurrentDepth(nn.Module):
    def __init__(self, d=8, k=3, classes=4):
        super().__init__()
        self.k = k
        self.inp = nn.Linear(d, d)
        self.block = nn.Sequential(nn.Linear(d, d), nn.BatchNorm1d(d, momentum=0.3), nn.Tanh())
        self.out = nn.Linear(d, classes)

    def forward(self, x):
        x = self.inp(x)
        for _ in range(self.k):
            x = x + self.block(x)
        return self.out(x)
