"""Shrinks, thresholds, PReLU, RReLU and alpha dropout for tests/export/check_export.py: what psd-export writes
for the modules and F.* functions, and what it refuses."""
import torch.nn as nn
import torch.nn.functional as F


class Shrinks(nn.Module):             # (N, 4, 3)
    def __init__(self):
        super().__init__()
        self.prelu = nn.PReLU(4)
        self.prelu1 = nn.PReLU(init=0.1)
        self.celu = nn.CELU(0.5)
        self.hs = nn.Hardshrink()
        self.ss = nn.Softshrink(0.25)
        self.th = nn.Threshold(0.1, -1.0)
        self.rr = nn.RReLU(0.1, 0.3)
        self.ad = nn.AlphaDropout(0.2)
        self.fad = nn.FeatureAlphaDropout(0.3)
        self.sg = nn.Softsign()
        self.ts = nn.Tanhshrink()

    def forward(self, x):
        x = self.ts(self.sg(self.celu(self.prelu1(self.prelu(x)))))
        x = self.th(self.ss(self.hs(x)))
        x = self.fad(self.ad(self.rr(x)))
        x = F.celu(x, alpha=2.0)
        x = F.softsign(F.tanhshrink(x))
        x = F.softshrink(F.hardshrink(x, 0.3), 0.2)
        x = F.threshold(x, 0.5, 0.0)
        x = F.rrelu(F.rrelu(x), 0.2, 0.4, training=True)   # eval's slope: LeakyReLU; training: RReLU
        x = F.alpha_dropout(x, 0.1)                         # training=False (the default): nothing
        x = F.feature_alpha_dropout(F.alpha_dropout(x, 0.1, training=True), 0.2, True)
        return x


class FunctionalPReLU(nn.Module):     # F.prelu with nn.PReLU's weight (its forward never called)
    def __init__(self):
        super().__init__()
        self.act = nn.PReLU(4)

    def forward(self, x):
        return F.prelu(x, self.act.weight)


class PReLUOwnSlope(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return F.prelu(x, self.fc.bias)          # REFUSED_PRELU_NAME
