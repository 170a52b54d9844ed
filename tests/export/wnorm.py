"""Weight-normalised models as audio and GAN code writes them (tests/export/check_wnorm.py trains them through psd
against PyTorch):

WNConvNet  features (N, 4, 16) -> nn.utils.weight_norm(Conv1d) (dim 0, HiFi-GAN's / WaveNet's), LeakyReLU,
           weight_norm(Conv1d, dim=None) without bias, flatten -> weight_norm(Linear) -> 4 classes.
WNUpNet    images (N, 3, 5, 5) -> weight_norm(Conv2d) -> ReLU -> weight_norm(ConvTranspose2d) (a GAN generator's
           upsampling; weight_norm's dim 0 is its in_channels) -> flatten -> Linear.

And for psd-export's refusals: SpectralNet (nn.utils.spectral_norm of a Linear), PrunedNet (a Linear pruned by
torch.nn.utils.prune), WNDim1 (weight_norm(Linear, dim=1): a norm per column), WNLstm (weight_norm of an LSTM's
weight_hh_l0), ExtraBuffer (a Linear with a buffer of its own, no hook),
Orthogonal (torch.nn.utils.parametrizations.orthogonal: a ParametrizedLinear).

WNConvNet and WNUpNet copy by rebuilding themselves and loading their state_dict: PyTorch 1.13 cannot deepcopy a weight-normed
module (its weight is a computed tensor, which deepcopy refuses), and the checks copy models.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.utils.prune as prune
from torch.nn.utils import spectral_norm, weight_norm


class Copyable(nn.Module):
    def __deepcopy__(self, memo):
        new = type(self)().to(next(self.parameters()).dtype)
        new.load_state_dict(self.state_dict())
        return new.train(self.training)


class WNConvNet(Copyable):
    def __init__(self):
        super().__init__()
        self.c1 = weight_norm(nn.Conv1d(4, 6, 3, padding=1))
        self.c2 = weight_norm(nn.Conv1d(6, 5, 5, padding=2, bias=False), dim=None)
        self.fc = weight_norm(nn.Linear(5 * 16, 4))

    def forward(self, x):
        h = F.leaky_relu(self.c1(x), 0.1)
        h = F.leaky_relu(self.c2(h), 0.1)
        return self.fc(h.flatten(1))


class WNUpNet(Copyable):
    def __init__(self):
        super().__init__()
        self.conv = weight_norm(nn.Conv2d(3, 4, 3, padding=1))
        self.up = weight_norm(nn.ConvTranspose2d(4, 2, 2, stride=2))
        self.fc = nn.Linear(2 * 10 * 10, 4)

    def forward(self, x):
        return self.fc(self.up(F.relu(self.conv(x))).flatten(1))


class SpectralNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = spectral_norm(nn.Linear(8, 8))

    def forward(self, x):
        return self.l(x)


class PrunedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(8, 8)
        prune.l1_unstructured(self.l, "weight", amount=0.5)

    def forward(self, x):
        return self.l(x)


class WNDim1(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = weight_norm(nn.Linear(8, 8), dim=1)

    def forward(self, x):
        return self.l(x)


class WNLstm(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = weight_norm(nn.LSTM(8, 8, batch_first=True), "weight_hh_l0")

    def forward(self, x):
        return self.rnn(x)[0]


class ExtraBuffer(nn.Module):
    """A Linear holding a tensor its kind does not read (no hook): its weights would not load."""

    def __init__(self):
        super().__init__()
        self.l = nn.Linear(8, 8)
        self.l.register_buffer("scale", torch.ones(8))

    def forward(self, x):
        return self.l(x)


class Orthogonal(nn.Module):
    """torch.nn.utils.parametrizations.orthogonal of a Linear (a ParametrizedLinear)."""

    def __init__(self):
        super().__init__()
        self.l = nn.utils.parametrizations.orthogonal(nn.Linear(8, 8))

    def forward(self, x):
        return self.l(x)
