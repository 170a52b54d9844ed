"""Elementwise math for tests/export/check_export.py: what psd-export writes for the numbers and operators
users put in their own layers, and what it refuses."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Arith(nn.Module):               # (N, 6)
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.elu = nn.ELU(alpha=0.5)
        self.sp = nn.Softplus(beta=2.0, threshold=10.0)

    def forward(self, x):
        y = self.fc(x)
        a = 2.0 - y                   # c - x: MulConstant -1, AddConstant 2
        b = y - 0.5 + 0                # x - c: AddConstant -0.5 (+ 0: nothing)
        c = (a - b) ** 2               # Sub, Pow
        d = torch.clamp(c, max=3.0).clamp_min(-1.0)   # Hardtanh (-inf, 3), Hardtanh (-1, inf)
        e = self.sp(self.elu(d)).unsqueeze(1).squeeze()
        return -F.relu(e.clamp(min=0) ** 1)   # ReLU, (** 1: nothing) ReLU, -x: MulConstant -1


class PowByTensor(nn.Module):
    def forward(self, x):
        return x ** x                 # REFUSED_POW


class ClampByTensor(nn.Module):
    def forward(self, x):
        return x.clamp(min=x * 0.5)   # REFUSED_CLAMP


class SqueezeBatch(nn.Module):
    def forward(self, x):
        return x.unsqueeze(0)         # REFUSED_SQUEEZE


class UnevenAdaptiveMax(nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = nn.AdaptiveMaxPool2d(4)

    def forward(self, x):
        return self.pool(x.reshape(x.shape[0], 1, 2, 3))   # REFUSED_ADAPTIVE_MAX


class SubOfTwoRanks(nn.Module):
    def forward(self, x):
        return x - x.unsqueeze(1)                # REFUSED_SUB_BROADCAST


class Broadcasts(nn.Module):          # (N, 6): numpy broadcasting, norms and variances as values
    def forward(self, x):
        c = x - x.mean(dim=1, keepdim=True)       # the mean (Reshape, AdaptiveAvgPool2d, Reshape), Sub
        s = c / x.std(1, keepdim=True)            # x.std's steps, Div
        return s / s.norm(dim=1, keepdim=True)    # the norm: sum(s * Normalize(s)), Div
