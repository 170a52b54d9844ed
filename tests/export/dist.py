"""Distances to parameters as users write them (prototype, RBF and k-means-style layers, metric learning), and
torch.sign (tests/export/check_dist.py trains each through psd against PyTorch):

ProtoNet   features (N, 6) -> Linear -> tanh -> -((h.unsqueeze(1) - self.c.unsqueeze(0)) ** 2).sum(-1): squared
           distances to 5 learned class prototypes (a parameter of the top module) as logits.
ProtoViews the prototypes' views: h[:, None] - self.protos.c[None] (a submodule's parameter), self.c2.view(1, 4, 8),
           h.unsqueeze(-1) - self.c3.t() (the transpose: (8, 3) per sample) -> joined -> Linear.
Cdists     torch.cdist(h, self.c) (p 2), torch.cdist(h, self.c1, p=1), torch.cdist of (N, 3, 8) rows against a
           parameter's (4, 8) (p inf), and of (N, 3, 8) against itself (each row's distance to itself 0: PyTorch's
           gradient there is 0) -> joined -> Linear.
Pairs      F.pairwise_distance(a(x), b(x)), with p 1 and keepdim, nn.PairwiseDistance(eps=1e-3), against a learned
           anchor F.pairwise_distance(h, self.anchor) and F.cosine_similarity(a(x), b(x)) -> joined -> Linear.
Signs      torch.sign(h) * h (|h|: the gradient through h's side only), h.sign() added to a Linear's output (no
           gradient through the sign).
Pools      nn.LPPool2d / nn.LPPool1d and F.lp_pool2d of several norms, kernels, strides, ceil_mode.
BufferMask a buffer's view as a mask (self.mask[None] == 0 in masked_fill), as before.
KMeans     fixed centres (a registered buffer (5, 8)): -((h.unsqueeze(1) - self.centers.unsqueeze(0)) ** 2).sum(-1),
           and torch.cdist(h, self.centers[None]) (the buffer indexed by None).

And for psd-export's refusals: DistAll (torch.dist: one number for the batch), CdistBatch (cdist of two computed
(N, M) tensors: every sample against every other), CdistP3 (cdist with p 3), ProtoMatmulView (a view of a parameter
as a MatMul operand).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ProtoNet(nn.Module):
    def __init__(self, features=6, embed=8, classes=5):
        super().__init__()
        self.l = nn.Linear(features, embed)
        self.c = nn.Parameter(torch.randn(classes, embed))

    def forward(self, x):
        h = torch.tanh(self.l(x))
        return -((h.unsqueeze(1) - self.c.unsqueeze(0)) ** 2).sum(-1)


class ProtoReshape(ProtoNet):
    """ProtoNet with the prototypes read as self.c.view(1, 5, 8) (its ONNX export: a Reshape of the initializer)."""
    def forward(self, x):
        h = torch.tanh(self.l(x))
        return -((h.unsqueeze(1) - self.c.view(1, 5, 8)) ** 2).sum(-1)


class Protos(nn.Module):
    def __init__(self, n, d):
        super().__init__()
        self.c = nn.Parameter(torch.randn(n, d))


class ProtoViews(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(6, 8)
        self.protos = Protos(5, 8)
        self.c2 = nn.Parameter(torch.randn(4, 8))
        self.c3 = nn.Parameter(torch.randn(3, 8))
        self.fc = nn.Linear(5 + 4 + 3, 4)

    def forward(self, x):
        h = torch.tanh(self.l(x))
        d1 = ((h[:, None] - self.protos.c[None]) ** 2).mean(-1)
        d2 = (h.unsqueeze(1) - self.c2.view(1, 4, 8)).abs().sum(2) / 8
        d3 = ((h.unsqueeze(-1) - self.c3.t()) ** 2).mean(1)
        return self.fc(torch.cat([d1, d2, d3], 1))


class Cdists(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(6, 8)
        self.rows = nn.Linear(6, 24)
        self.c = nn.Parameter(torch.randn(5, 8))
        self.c1 = nn.Parameter(torch.randn(3, 8))
        self.c3 = nn.Parameter(torch.randn(4, 8))
        self.fc = nn.Linear(5 + 3 + 12 + 9, 4)

    def forward(self, x):
        h = torch.tanh(self.l(x))
        r = torch.tanh(self.rows(x)).view(-1, 3, 8)
        d = torch.cdist(h, self.c)
        d1 = torch.cdist(h, self.c1, p=1)
        dinf = torch.cdist(r, self.c3, p=float("inf")).flatten(1)
        dself = torch.cdist(r, r).flatten(1)
        return self.fc(0.25 * torch.cat([d, d1, dinf, dself], 1))


class Pairs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 8)
        self.b = nn.Linear(6, 8)
        self.anchor = nn.Parameter(torch.randn(8))
        self.pd = nn.PairwiseDistance(eps=1e-3)
        self.fc = nn.Linear(5, 3)

    def forward(self, x):
        a, b = torch.tanh(self.a(x)), torch.tanh(self.b(x))
        d = F.pairwise_distance(a, b)
        d1 = F.pairwise_distance(a, b, p=1, keepdim=True)
        d2 = self.pd(b, a)
        d3 = F.pairwise_distance(a, self.anchor)
        cs = F.cosine_similarity(a, b)
        return self.fc(torch.cat([d[:, None], d1, d2.unsqueeze(1), d3.unsqueeze(1), cs.unsqueeze(1)], 1))


class PairsL2(nn.Module):
    """Pairs' p 2 parts alone, for the ONNX export: PyTorch 1.13 exports pairwise_distance as the sum of (x1 - x2)^q
    to the power 1/q with q = p + eps, no Abs and no eps added - p 1 comes out wrong (NaN for a negative sum)."""
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 8)
        self.b = nn.Linear(6, 8)
        self.anchor = nn.Parameter(torch.randn(8))
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        a, b = torch.tanh(self.a(x)), torch.tanh(self.b(x))
        d = F.pairwise_distance(a, b)
        d3 = F.pairwise_distance(a, self.anchor)
        cs = F.cosine_similarity(a, b)
        return self.fc(torch.stack([d, d3, cs], 1))


class Signs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 8)
        self.b = nn.Linear(6, 8)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        h = self.a(x)
        return self.fc(torch.sign(h) * h + self.b(x) + x.sign().sum(1, keepdim=True))


class KMeans(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(6, 8)
        self.register_buffer("centers", torch.randn(5, 8))
        self.fc = nn.Linear(10, 3)

    def forward(self, x):
        h = torch.tanh(self.l(x))
        d = -((h.unsqueeze(1) - self.centers.unsqueeze(0)) ** 2).sum(-1)
        return self.fc(torch.cat([d, torch.cdist(h.unsqueeze(1), self.centers[None]).flatten(1)], 1))


class Pools(nn.Module):
    """nn.LPPool2d(2, 2), nn.LPPool2d(3, (2, 3), stride=(1, 2), ceil_mode=True), nn.LPPool1d(1.5, 3, stride=2) and
    F.lp_pool2d(h, 2, 3) of a Linear's output viewed as (2, 6, 6) (sigmoid where p is odd or fractional: a
    negative window's sum has no real root, NaN in PyTorch too)."""
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(6, 72)
        self.p2 = nn.LPPool2d(2, 2)
        self.p3 = nn.LPPool2d(3, (2, 3), stride=(1, 2), ceil_mode=True)
        self.p1 = nn.LPPool1d(1.5, 3, stride=2)
        self.fc = nn.Linear(18 + 30 + 32 + 8, 3)

    def forward(self, x):
        h = self.l(x).view(-1, 2, 6, 6)
        s = torch.sigmoid(h)
        a = self.p2(h).flatten(1)
        b = self.p3(s).flatten(1)
        c = self.p1(s.view(-1, 4, 18)).flatten(1)
        d = F.lp_pool2d(h, 2, 3).flatten(1)
        return self.fc(torch.cat([a, b, c, d], 1))


class BufferMask(nn.Module):
    """A buffer's view read as a mask, as before views of buffers were values: self.mask[None] == 0 of a
    registered (4, 4) tril (a MaskedFill)."""
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(6, 16)
        self.register_buffer("mask", torch.tril(torch.ones(4, 4)), persistent=False)
        self.fc = nn.Linear(16 + 6, 3)

    def forward(self, x):
        h = self.l(x).view(-1, 4, 4)
        a = h.masked_fill(self.mask[None] == 0, float("-inf")).softmax(-1).flatten(1)
        return self.fc(torch.cat([a, x], 1))


class DistAll(ProtoNet):
    def forward(self, x):
        h = self.l(x)
        return h * torch.dist(h, torch.tanh(h))


class CdistBatch(ProtoNet):
    def forward(self, x):
        h = self.l(x)
        return torch.cdist(h, torch.tanh(h))


class CdistP3(ProtoNet):
    def forward(self, x):
        return torch.cdist(self.l(x), self.c, p=3)


class ProtoMatmulView(ProtoNet):
    def forward(self, x):
        return self.l(x) @ self.c.view(8, 5)


class ProtoT(nn.Module):
    """Prototypes stored (embed, classes) and read transposed: h - self.c.t() (its ONNX export: a Transpose of the
    initializer, read as a Parameter under its own name and shape, then a Permute)."""
    def __init__(self, features=6, embed=8, classes=5):
        super().__init__()
        self.l = nn.Linear(features, embed * classes)
        self.c = nn.Parameter(torch.randn(embed, classes))

    def forward(self, x):
        h = torch.tanh(self.l(x)).view(-1, 5, 8)
        return -((h - self.c.t()) ** 2).sum(-1)
