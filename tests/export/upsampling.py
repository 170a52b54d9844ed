"""Upsampling models for tests/export/check_upsampling.py: a convolutional
autoencoder (strided Conv2d down, ConvTranspose2d up), a small U-Net (strided
convolutions down, nn.UpsamplingNearest2d / F.interpolate / nn.Upsample up,
the skips joined by torch.cat), and what psd-export refuses."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ConvAutoencoder(nn.Module):     # (N, 1, 28, 28) -> same: Fashion-MNIST's images
    def __init__(self, width=8):
        super().__init__()
        self.enc1 = nn.Conv2d(1, width, 3, stride=2, padding=1)                          # (w, 14, 14)
        self.enc2 = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1)                  # (2w, 7, 7)
        self.dec1 = nn.ConvTranspose2d(2 * width, width, 3, stride=2, padding=1, output_padding=1)   # (w, 14, 14)
        self.dec2 = nn.ConvTranspose2d(width, 1, 3, stride=2, padding=1, output_padding=1)           # (1, 28, 28)

    def forward(self, x):
        x = F.relu(self.enc1(x))
        x = F.relu(self.enc2(x))
        x = F.relu(self.dec1(x))
        return torch.sigmoid(self.dec2(x))


class UNet(nn.Module):                # (N, 3, 16, 16) -> (N, 2, 16, 16)
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)                      # (8, 16, 16)
        self.d1 = nn.Conv2d(8, 16, 3, stride=2, padding=1)           # (16, 8, 8)
        self.d2 = nn.Conv2d(16, 16, 3, stride=2, padding=1)          # (16, 4, 4)
        self.up2 = nn.UpsamplingNearest2d(scale_factor=2)            # (16, 8, 8)
        self.m2 = nn.Conv2d(32, 16, 3, padding=1)                    # cat with d1: (32, 8, 8) -> (16, 8, 8)
        self.up1 = nn.Upsample(scale_factor=2, mode="bilinear")      # (16, 16, 16)
        self.side = nn.UpsamplingBilinear2d(size=(16, 16))           # align_corners=True: (16, 16, 16)
        self.up0 = nn.ConvTranspose2d(16, 8, 2, stride=2)            # (8, 16, 16)
        self.out = nn.Conv2d(48, 2, 1)                               # cat: (16 + 16 + 8 + 8, 16, 16)

    def forward(self, x):
        s1 = F.relu(self.c1(x))
        s2 = F.relu(self.d1(s1))
        b = F.relu(self.d2(s2))
        m = F.relu(self.m2(torch.cat([self.up2(b), s2], 1)))
        u = self.up1(m)
        v = self.side(F.interpolate(b, size=s2.shape[2:], mode="nearest"))   # (16, 8, 8): the skip's size
        w = self.up0(m)
        return self.out(torch.cat([u, v, w, s1], 1))


class UpOutputSize(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose2d(4, 2, 3, stride=2)

    def forward(self, x):
        return self.up(x, output_size=[9, 9])              # REFUSED: output_size


class Bicubic(nn.Module):
    def forward(self, x):
        return F.interpolate(x, scale_factor=2, mode="bicubic")     # REFUSED: bicubic


class SizeFromBatch(nn.Module):
    def forward(self, x):
        return F.interpolate(x, size=(x.shape[0], 4), mode="nearest")   # REFUSED: from the batch size


class NearestExact(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Upsample(scale_factor=2, mode="nearest-exact")

    def forward(self, x):
        return self.up(x)                                  # REFUSED: nearest-exact


class Upsample1d(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Upsample(scale_factor=2)

    def forward(self, x):
        return self.up(x)                                  # REFUSED: (C, L)
