"""Models as users write them around shape forms beyond psd's kinds: None-indexing and unsqueeze, nn.Unflatten,
reductions to one value per sample, torch.logsumexp, torch.cumsum (tests/export/check_shape3.py trains each through
psd against PyTorch):

SEGate     images (N, 2, 6, 6) -> Conv2d -> a squeeze-and-excitation gate written by hand: w = sigmoid(fc(h.mean((2,
           3)))), h * w[:, :, None, None], then h * w.unsqueeze(-1).unsqueeze(-1) of a second gate, and x[..., None]
           of the pooled features -> nn.Linear.
PerSample  features (N, 16) -> Linear -> h * h.mean(1)[:, None], (h.view(-1, 4, 4) * h.sum(1)[:, None, None]),
           h - h.amax(1, keepdim=True), torch.tanh(h.std(1)).unsqueeze(1), nn.Unflatten(1, (2, 8)) and
           h.unflatten(1, (4, -1)) -> nn.Linear (unflatten=False: views instead, for its ONNX export).
LogSumExp  features (N, 16) -> Linear -> h - torch.logsumexp(h, 1, keepdim=True) (a hand-written log_softmax),
           h.view(-1, 4, 4).logsumexp(dim=2) (a middle dim) and torch.logsumexp(h, -1)[:, None] (one value per
           sample) -> nn.Linear; its inputs are scaled so that exp(x) of the unshifted sum would overflow float32.
CumSum     features (N, 16) -> Linear -> torch.cumsum(h, 1), h.view(-1, 4, 4).cumsum(dim=-1) and
           torch.cumsum(.., dim=1) along the middle -> nn.Linear.

And for psd-export's refusals: NoneBatch (x[None], a dim before the batch), CumBatch (torch.cumsum along the batch),
LseBatch (torch.logsumexp over the batch).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class SEGate(nn.Module):
    def __init__(self, c=4, classes=4):
        super().__init__()
        self.conv = nn.Conv2d(2, c, 3, padding=1)
        self.fc1 = nn.Linear(c, c)
        self.fc2 = nn.Linear(c, c)
        self.pool_fc = nn.Linear(c, 2)
        self.fc = nn.Linear(c * 36 + 2, classes)

    def forward(self, x):
        h = F.relu(self.conv(x))
        w = torch.sigmoid(self.fc1(h.mean((2, 3))))
        h = h * w[:, :, None, None]
        v = torch.sigmoid(self.fc2(h.mean((2, 3))))
        h = h * v.unsqueeze(-1).unsqueeze(-1)
        p = self.pool_fc(h.mean((2, 3))[..., None].transpose(1, 2)).flatten(1)    # (N, 1, C) @ Linear
        return self.fc(torch.cat([h.flatten(1), p], 1))


class PerSample(nn.Module):
    def __init__(self, classes=4, unflatten=True):   # unflatten False: views instead (torch 1.13 cannot export
        super().__init__()                           # aten::unflatten to ONNX)
        self.unflatten = unflatten
        self.lin = nn.Linear(16, 16)
        self.u = nn.Unflatten(1, (2, 8))
        self.fc = nn.Linear(16 * 4 + 1, classes)

    def forward(self, x):
        h = torch.tanh(self.lin(x))
        a = h * h.mean(1)[:, None]
        b = (h.view(-1, 4, 4) * h.sum(1)[:, None, None]).flatten(1)
        c = h - h.amax(1, keepdim=True)
        d = torch.tanh(h.std(1)).unsqueeze(1)
        e = (self.u(h) if self.unflatten else h.view(-1, 2, 8)).transpose(1, 2).flatten(1)
        f = (h.unflatten(1, (4, -1)) if self.unflatten else h.view(-1, 4, 4)).transpose(1, 2).flatten(1)
        return self.fc(torch.cat([a, b, c, d, e - f * 0.5], 1))


class LogSumExp(nn.Module):
    def __init__(self, classes=4, scale=100.0):
        super().__init__()
        self.scale = scale
        self.lin = nn.Linear(16, 16)
        self.fc = nn.Linear(16 + 4 + 1, classes)

    def forward(self, x):
        h = self.lin(x) * self.scale                    # exp(h) of the unshifted sum overflows float32
        a = h - torch.logsumexp(h, 1, keepdim=True)
        b = h.view(-1, 4, 4).logsumexp(dim=2)
        c = torch.logsumexp(h, -1)[:, None]
        return self.fc(torch.cat([a / self.scale, b / self.scale, c / self.scale], 1))


class CumSum(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.fc = nn.Linear(48, classes)

    def forward(self, x):
        h = torch.tanh(self.lin(x))
        a = torch.cumsum(h, 1)
        b = h.view(-1, 4, 4).cumsum(dim=-1).flatten(1)
        c = torch.cumsum(h.view(-1, 4, 4), dim=1).flatten(1)
        return self.fc(torch.cat([a, b, c], 1))


class NoneBatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 4)

    def forward(self, x):
        return self.lin(x)[None].sum(0)


class CumBatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 4)

    def forward(self, x):
        return torch.cumsum(self.lin(x), 0)


class LseBatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 4)

    def forward(self, x):
        return self.lin(x) - torch.logsumexp(self.lin(x), 0)
