"""Models as users write them around fills and masks (tests/export/check_elem4.py trains each through psd against
PyTorch):

Fills      features (N, 8) -> a Linear h -> torch.maximum(h, torch.zeros_like(h)), torch.where(h > 0, h,
           torch.zeros_like(h)), h + torch.ones_like(h), torch.minimum(h, torch.full_like(h, 0.25)),
           h * h.new_full(h.shape, 0.5) + h.new_ones(h.size()) -> torch.cat -> nn.Linear.
States     features (N, 8) -> an initial state h0 = x.new_zeros(x.size(0), 16) (wider than x), x.new_ones(x.size(0),
           4) and x.new_full((x.size(0), 2, 3), 0.1) (narrower, of two dims) with Linears of x; h1 = tanh(inp(x) +
           rec(h0)), h2 = tanh(inp2(x) + rec2(h1) + h0) -> torch.cat -> nn.Linear.
Masked     features (N, 8) -> Linears h, g -> h.masked_fill(h < 0, 0.0), torch.masked_fill(h, h > 0.5, 1.0),
           h.masked_fill(m == 0, -1e9).softmax(-1) with m = (g > 0).float() a computed 0/1 mask, h.masked_fill(m != 1,
           0.3), h.masked_fill(~(g > 0.2), -0.5), h.masked_fill(g.bool(), 0.1) (g != 0), h.masked_fill(h == h.amax(-1,
           keepdim=True), -1e9).softmax(-1) (the top one out, two tensors compared), g itself -> torch.cat ->
           nn.Linear.

Masked's training-mode ONNX export (Where of Less, Greater, Equal of the float mask, Not, Cast to bool) goes through
psd's ONNX import too.

Broadcasts features (N, 8) -> Linears h (N, 6), g (N, 1), k (N, 6) -> torch.where(h > 0, h, g), torch.where(g > 0, h,
           0.0), torch.where(h > 0, g, k), h.masked_fill(g > 0.1, -0.5), torch.where(g < 0, h, 1.0); Linears viewed
           as v (N, 3, 4), r (N, 3, 1), c (N, 1, 4) -> torch.where(r > 0, v, c), v.masked_fill(c < 0, 0.0) (the
           condition, a, b and the mask broadcast), r -> torch.cat -> nn.Linear.

PadAttention  ids (N, 6) int64, 0 the pad -> nn.Embedding, q, k, v Linears, q @ k^T / sqrt(8); mask = (ids !=
           0).unsqueeze(1); scores.masked_fill(mask == 0, -1e9) and scores.masked_fill(~mask, -inf), each softmax @ v
           -> torch.cat -> flatten -> nn.Linear.

And for psd-export's refusals: NoBatch (h.new_zeros(4, 6): sizes without the batch), FillNaN (torch.full_like(h, nan)), FillLong (torch.zeros_like(h, dtype=torch.long)),
InPlaceShared (h.masked_fill_(h < 0, 0) with h read after).
"""
import torch
import torch.nn as nn


class Fills(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.lin = nn.Linear(8, 6)
        self.fc = nn.Linear(5 * 6, classes)

    def forward(self, x):
        h = self.lin(x)
        relu = torch.maximum(h, torch.zeros_like(h))
        pos = torch.where(h > 0, h, torch.zeros_like(h))
        shift = h + torch.ones_like(h)
        low = torch.minimum(h, torch.full_like(h, 0.25))
        half = h * h.new_full(h.shape, 0.5) + h.new_ones(h.size())
        return self.fc(torch.cat([relu, pos, shift, low, half], 1))


class States(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.inp, self.rec = nn.Linear(8, 16), nn.Linear(16, 16)
        self.inp2, self.rec2 = nn.Linear(8, 16), nn.Linear(16, 16)
        self.a, self.b = nn.Linear(8, 4), nn.Linear(8, 6)
        self.fc = nn.Linear(16 + 4 + 6, classes)

    def forward(self, x):
        h0 = x.new_zeros(x.size(0), 16)
        h1 = torch.tanh(self.inp(x) + self.rec(h0))
        h2 = torch.tanh(self.inp2(x) + self.rec2(h1) + h0)
        a = self.a(x) * x.new_ones(x.size(0), 4)
        b = self.b(x).view(-1, 2, 3) + x.new_full((x.size(0), 2, 3), 0.1)
        return self.fc(torch.cat([h2, a, b.flatten(1)], 1))


class Masked(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.lin, self.g = nn.Linear(8, 6), nn.Linear(8, 6)
        self.fc = nn.Linear(8 * 6, classes)

    def forward(self, x):
        h, g = self.lin(x), self.g(x)
        m = (g > 0).float()
        parts = [h.masked_fill(h < 0, 0.0), torch.masked_fill(h, h > 0.5, 1.0),
                 h.masked_fill(m == 0, -1e9).softmax(-1), h.masked_fill(m != 1, 0.3),
                 h.masked_fill(~(g > 0.2), -0.5), g, h.masked_fill(g.bool(), 0.1),
                 h.masked_fill(h == h.amax(-1, keepdim=True), -1e9).softmax(-1)]
        return self.fc(torch.cat(parts, 1))


class Broadcasts(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.lin, self.g, self.k = nn.Linear(8, 6), nn.Linear(8, 1), nn.Linear(8, 6)
        self.v, self.r, self.c = nn.Linear(8, 12), nn.Linear(8, 3), nn.Linear(8, 4)
        self.fc = nn.Linear(5 * 6 + 2 * 12 + 3, classes)

    def forward(self, x):
        h, g, k = self.lin(x), self.g(x), self.k(x)
        v, r, c = self.v(x).view(-1, 3, 4), self.r(x).view(-1, 3, 1), self.c(x).view(-1, 1, 4)
        parts = [torch.where(h > 0, h, g), torch.where(g > 0, h, 0.0), torch.where(h > 0, g, k),
                 h.masked_fill(g > 0.1, -0.5), torch.where(g < 0, h, 1.0)]
        grid = [torch.where(r > 0, v, c), v.masked_fill(c < 0, 0.0)]
        return self.fc(torch.cat(parts + [t.flatten(1) for t in grid + [r]], 1))   # r: a gradient for self.r


class NoBatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 6)

    def forward(self, x):
        h = self.lin(x)
        return h + h.new_zeros(4, 6).sum(0)


class FillNaN(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 6)

    def forward(self, x):
        h = self.lin(x)
        return torch.maximum(h, torch.full_like(h, float("nan")))


class FillLong(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 6)

    def forward(self, x):
        h = self.lin(x)
        return h + torch.zeros_like(h, dtype=torch.long)


class InPlaceShared(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 6)

    def forward(self, x):
        h = self.lin(x)
        r = h.masked_fill_(h < 0, 0.0)
        return r + h


class PadAttention(nn.Module):
    """Attention over token ids written by hand with the padding mask users build (The Annotated Transformer's
    mask = (src != pad).unsqueeze(-2); scores.masked_fill(mask == 0, -1e9)): ids (N, 6) int64, 0 the pad."""

    def __init__(self, vocab=20, dim=8, classes=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.fc = nn.Linear(2 * 6 * dim, classes)

    def forward(self, ids):
        e = self.emb(ids)
        q, k, v = self.q(e), self.k(e), self.v(e)
        scores = q @ k.transpose(-2, -1) / 8 ** 0.5                      # (N, 6, 6)
        mask = (ids != 0).unsqueeze(1)                                  # (N, 1, 6)
        a = scores.masked_fill(mask == 0, -1e9).softmax(-1) @ v
        b = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        return self.fc(torch.cat([a, b], 1).flatten(1))
