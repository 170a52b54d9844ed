"""Models as users write them around elementwise functions (tests/export/check_elem3.py trains each through psd
against PyTorch):

Extremes  features (N, 8) -> two Linears -> torch.maximum(a, b), torch.minimum(a, b), torch.max(a, g) and
          a.min(g) with g (N, 1) from a Linear (broadcast), torch.maximum(a, F.relu(a)) (ties wherever a > 0:
          half the gradient to each operand) -> torch.cat -> nn.Linear.
Wheres    features (N, 8) -> a Linear -> torch.where(h > 0, h, 0.1 * h) (a leaky ReLU by hand), torch.where(0.5 >= h,
          h, 0.0), torch.where(h < g, 1.0, g) (a comparison of two tensors), torch.where(h.ge(-0.2), torch.tanh(h),
          -1.0), torch.where(h < h.amax(-1, keepdim=True), h, float('-inf')).softmax(-1) (the top one masked) ->
          torch.cat -> nn.Linear.
Periodic  features (N, 8) -> a Linear -> torch.sin(h), h.cos(), torch.log1p(h.abs()), torch.expm1(0.3 * h) ->
          torch.cat -> nn.Linear (sinusoidal features).
Flips     sequences (N, 4, 6) -> a Linear -> h + torch.flip(h, dims=[1]) (both directions of the sequence),
          h.flip(-1), torch.fliplr(h), h.flip(1, 2) -> torch.cat -> flatten -> nn.Linear.

Wheres(number_a=False), Periodic(expm1=False) and Flips(fliplr=False) are the forms PyTorch 1.13 exports to ONNX
(as float; torch.flip as Slices with step -1).

Masks     features (N, 8) -> a Linear -> h * (h > 0).float() + h * (h < -0.5) + 0.5 * h * (h >= 0.3).to(torch.float32)
          (comparison masks multiplied in) -> nn.Linear.

And for psd-export's refusals: WhereIndices (torch.where(cond) alone), FlipBatch (torch.flip over dim 0),
CompareInf (h > inf), WhereBuffer (a buffer as the condition); a and b that broadcast against the condition are
tests/export/elem4.py's Broadcasts, trained.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Extremes(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.a, self.b, self.g = nn.Linear(8, 6), nn.Linear(8, 6), nn.Linear(8, 1)
        self.fc = nn.Linear(5 * 6, classes)

    def forward(self, x):
        a, b, g = self.a(x), self.b(x), self.g(x)
        return self.fc(torch.cat([torch.maximum(a, b), torch.minimum(a, b), torch.max(a, g), a.min(g),
                                  torch.maximum(a, F.relu(a))], 1))


class Wheres(nn.Module):
    def __init__(self, classes=4, number_a=True):
        super().__init__()
        self.number_a = number_a          # False: PyTorch 1.13's ONNX export types where(c, 1.0, g) double
        self.lin, self.g = nn.Linear(8, 6), nn.Linear(8, 6)
        self.fc = nn.Linear(5 * 6, classes)

    def forward(self, x):
        h, g = self.lin(x), self.g(x)
        leaky = torch.where(h > 0, h, 0.1 * h)
        low = torch.where(0.5 >= h, h, 0.0)
        pick = torch.where(h < g, 1.0, g) if self.number_a else torch.where(h < g, h, g)
        sat = torch.where(h.ge(-0.2), torch.tanh(h), -1.0)
        masked = torch.where(h < h.amax(-1, keepdim=True), h, float("-inf")).softmax(-1)   # all but the top
        return self.fc(torch.cat([leaky, low, pick, sat, masked], 1))


class Periodic(nn.Module):
    def __init__(self, classes=4, expm1=True):
        super().__init__()
        self.expm1 = expm1                # False: 0.3 * h itself (PyTorch 1.13 does not export expm1 to ONNX)
        self.lin = nn.Linear(8, 6)
        self.fc = nn.Linear(4 * 6, classes)

    def forward(self, x):
        h = self.lin(x)
        e = torch.expm1(0.3 * h) if self.expm1 else 0.3 * h
        return self.fc(torch.cat([torch.sin(h), h.cos(), torch.log1p(h.abs()), e], 1))


class Flips(nn.Module):
    def __init__(self, classes=4, fliplr=True):
        super().__init__()
        self.fliplr = fliplr              # False: h.flip(1) (PyTorch 1.13 does not export fliplr to ONNX)
        self.lin = nn.Linear(6, 5)
        self.fc = nn.Linear(4 * 4 * 5, classes)

    def forward(self, x):
        h = self.lin(x)                                              # (N, 4, 5)
        both = h + torch.flip(h, dims=[1])
        lr = torch.fliplr(h) if self.fliplr else h.flip(1)
        return self.fc(torch.cat([both, h.flip(-1), lr, h.flip(1, 2)], 1).flatten(1))


class Masks(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.lin = nn.Linear(8, 6)
        self.fc = nn.Linear(6, classes)

    def forward(self, x):
        h = self.lin(x)
        return self.fc(h * (h > 0).float() + h * (h < -0.5) + 0.5 * h * (h >= 0.3).to(torch.float32))


class WhereIndices(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        h = self.lin(x)
        return h * torch.where(h > 0)[0].float().sum()


class FlipBatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        return torch.flip(self.lin(x), dims=[0])


class CompareInf(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        h = self.lin(x)
        return torch.where(h < float("inf"), h, 0.0)


class WhereBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.register_buffer("keep", torch.tensor([True, False, True, True]))

    def forward(self, x):
        return torch.where(self.keep, self.lin(x), 0.0)
