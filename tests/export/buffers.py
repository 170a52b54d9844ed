"""Registered buffers read as values (tests/it_buffers.sh): a sinusoidal positional encoding sliced to the
sequence, image normalisation by mean / std buffers, a buffer without a leading 1, a non-persistent scale, a
buffer read twice, a stepped slice; and forms psd-export refuses."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, MAX_LEN, E = 20, 16, 8


def sinusoid(max_len, d):
    pe = torch.zeros(max_len, d)
    pos = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return pe


class PosEnc(nn.Module):
    """The transformer tutorials' positional encoding, batch first: (1, max_len, d), x + pe[:, :T]."""

    def __init__(self):
        super().__init__()
        self.register_buffer("pe", sinusoid(MAX_LEN, E).unsqueeze(0))

    def forward(self, x):
        return x + self.pe[:, :x.size(1)]


class PosEncNet(nn.Module):
    """Token ids -> embedding * sqrt(d) + the encoding (a submodule's buffer: pos.pe) -> a layer -> mean
    over tokens -> 4 classes."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, E)
        self.pos = PosEnc()
        self.fc = nn.Linear(E, E)
        self.head = nn.Linear(E, 4)

    def forward(self, x):
        h = self.pos(self.emb(x) * math.sqrt(E))
        return self.head(torch.tanh(self.fc(h)).mean(1))


class TablePos(nn.Module):
    """A (max_len, d) table without the leading 1 (pe[:T] broadcast over the batch), a scale buffer of one
    dim (d,) read twice (a Mul and a Div), and a top-level buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", sinusoid(MAX_LEN, E))
        self.register_buffer("gain", torch.linspace(0.5, 1.5, E))
        self.fc = nn.Linear(E, E)
        self.head = nn.Linear(E, 3)

    def forward(self, x):
        h = self.fc(x) + self.table[:x.size(1)]
        h = torch.tanh(h * self.gain)
        return self.head((h / self.gain).flatten(1)[:, :E])


class Normalized(nn.Module):
    """torchvision-style input normalisation: (x - mean) / std with (3, 1, 1) buffers, then a CNN; and a
    (1, 4, 1, 1) shift buffer subtracted from a feature map."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1))
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1))
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.register_buffer("shift", torch.tensor([0.1, -0.2, 0.3, 0.0]).view(1, 4, 1, 1))
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        h = F.relu(self.conv((x - self.mean) / self.std)) - self.shift
        return self.fc(h.mean((2, 3)))


class NonPersistent(nn.Module):
    """A buffer registered with persistent=False: not in the module's state_dict, in psd's."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.register_buffer("scale", torch.linspace(-1.0, 1.0, 6), persistent=False)
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        return self.head(torch.relu(self.fc(x) * self.scale))


class Stepped(nn.Module):
    """Every other row of a (1, 2 * max_len, d) buffer (pe[:, ::2], a Narrow with a step), added to the
    input itself."""

    def __init__(self):
        super().__init__()
        self.register_buffer("pe", torch.randn(1, 2 * MAX_LEN, E))
        self.fc = nn.Linear(E, 2)

    def forward(self, x):
        return self.fc((x + self.pe[:, ::2]).mean(1))


class Derived(nn.Module):
    """Refused: a tensor computed from a buffer (2 * pe) read as a value."""

    def __init__(self):
        super().__init__()
        self.register_buffer("pe", torch.randn(1, MAX_LEN, E))
        self.fc = nn.Linear(E, 2)

    def forward(self, x):
        return self.fc((x + 2 * self.pe).mean(1))


class BatchSized(nn.Module):
    """Refused: a buffer whose leading dim (2) would face the batch."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.randn(2, MAX_LEN, E))
        self.fc = nn.Linear(E, 2)

    def forward(self, x):
        return self.fc((x + self.b).mean(1))
