"""The Spatial Transformer Networks tutorial's model (PyTorch tutorials, "Spatial Transformer Networks Tutorial"),
written from its description, for tests/it_stn.sh: a localisation net (Conv2d, MaxPool2d, ReLU twice) regresses
an affine theta (fc_loc: Linear, ReLU, Linear, initialised to the identity), F.affine_grid(theta, x.size()) and
F.grid_sample(x, grid) warp the input, then the tutorial's MNIST classifier (two convolutions, Dropout2d, two
Linears, dropout, log_softmax). p: the dropouts' probability (the tutorial's 0.5; 0 for a comparison with PyTorch's
own loop, whose dropout draws psd does not replay).

StnBorder warps with padding_mode border and align_corners True; StnNearest samples nearest (its grid gets no
gradient: the localisation net does not train, as in PyTorch). GridNet reads the input at a grid computed per point
(the ONNX import's path: PyTorch 1.13 exports grid_sample, not affine_grid). AffineGrid3d (a 5-d size) and
GridBicubic are refused by psd-export.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self, p=0.5, padding_mode="zeros", align_corners=False, mode="bilinear"):
        super().__init__()
        self.p, self.padding_mode, self.align_corners, self.mode = p, padding_mode, align_corners, mode
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d(p)
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)
        # the spatial transformer's localisation network
        self.localization = nn.Sequential(
            nn.Conv2d(1, 8, kernel_size=7),
            nn.MaxPool2d(2, stride=2),
            nn.ReLU(True),
            nn.Conv2d(8, 10, kernel_size=5),
            nn.MaxPool2d(2, stride=2),
            nn.ReLU(True),
        )
        # the regressor of the 3 x 2 affine matrix, starting at the identity
        self.fc_loc = nn.Sequential(nn.Linear(10 * 3 * 3, 32), nn.ReLU(True), nn.Linear(32, 3 * 2))
        self.fc_loc[2].weight.data.zero_()
        self.fc_loc[2].bias.data.copy_(torch.tensor([1, 0, 0, 0, 1, 0], dtype=torch.float))

    def stn(self, x):
        xs = self.localization(x)
        xs = xs.view(-1, 10 * 3 * 3)
        theta = self.fc_loc(xs)
        theta = theta.view(-1, 2, 3)
        grid = F.affine_grid(theta, x.size(), align_corners=self.align_corners)
        return F.grid_sample(x, grid, mode=self.mode, padding_mode=self.padding_mode,
                             align_corners=self.align_corners)

    def forward(self, x):
        x = self.stn(x)
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, p=self.p, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


class StnBorder(Net):
    def __init__(self, p=0.0):
        super().__init__(p, padding_mode="border", align_corners=True)


class StnReflection(Net):
    def __init__(self, p=0.0):
        super().__init__(p, padding_mode="reflection")


class StnNearest(Net):
    def __init__(self, p=0.0):
        super().__init__(p, mode="nearest")


class AffineGrid3d(nn.Module):
    """A 3-d affine grid (theta (N, 3, 4), a 5-d size): refused."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 12)

    def forward(self, x):
        theta = self.fc(x.flatten(1)).view(-1, 3, 4)
        return F.affine_grid(theta, [x.shape[0], 1, 2, 2, 2], align_corners=False).flatten(1)


class GridBicubic(nn.Module):
    """grid_sample in mode bicubic: refused."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 6)

    def forward(self, x):
        theta = self.fc(x.flatten(1)).view(-1, 2, 3)
        grid = F.affine_grid(theta, x.size(), align_corners=False)
        return F.grid_sample(x, grid, mode="bicubic", align_corners=False).flatten(1)


class GridNet(nn.Module):
    """A grid computed per point (a 1x1 convolution of the input, tanh, permuted to (N, H, W, 2)) read by
    F.grid_sample with border padding, then a small classifier: PyTorch 1.13 exports grid_sample to ONNX (opset 16:
    GridSample), not affine_grid, so this is the ONNX import's path."""

    def __init__(self):
        super().__init__()
        self.grid = nn.Conv2d(1, 2, kernel_size=1)
        self.conv = nn.Conv2d(1, 4, kernel_size=5, stride=2)
        self.fc = nn.Linear(4 * 12 * 12, 10)

    def forward(self, x):
        g = torch.tanh(self.grid(x)).permute(0, 2, 3, 1)
        x = F.grid_sample(x, g, padding_mode="border", align_corners=False)
        return self.fc(F.relu(self.conv(x)).flatten(1))
