"""Models as users write them around F.unfold / nn.Unfold (im2col) and F.fold / nn.Fold (col2im)
(tests/export/check_unfold.py trains each through psd against PyTorch):

PatchEmbed  a hand-written ViT patch embedding: images (N, 3, 8, 8) -> F.unfold(x, kernel_size=4, stride=4)
            (N, 48, 4) patches -> transpose(1, 2) -> nn.Linear(48, 16) per patch -> GELU -> flatten -> nn.Linear.
LocalConv   a custom convolution and an overlap-add: images (N, 2, 7, 4) -> nn.Unfold(kernel_size=(3, 2),
            dilation=(1, 2), padding=1, stride=(2, 1)) -> transpose -> nn.Linear (the kernel as a matrix) ->
            tanh -> F.unfold(h, 3, padding=1) -> tanh -> nn.Fold(output_size, 3, padding=1) (overlaps summed) / 9
            (their mean) -> flatten -> nn.Linear.
FoldStride  columns as input: (N, 12, 6) -> F.fold(c, output_size=(5, 6), kernel_size=(2, 3), stride=2, padding=1,
            dilation=(1, 2)) -> Conv2d -> flatten -> nn.Linear.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class PatchEmbed(nn.Module):
    def __init__(self, patch=4, dim=16, classes=4):
        super().__init__()
        self.patch = patch
        self.proj = nn.Linear(3 * patch * patch, dim)
        self.head = nn.Linear(4 * dim, classes)

    def forward(self, x):
        p = F.unfold(x, kernel_size=self.patch, stride=self.patch)   # (N, C p p, L)
        h = F.gelu(self.proj(p.transpose(1, 2)))                      # (N, L, dim)
        return self.head(h.flatten(1))


class LocalConv(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.cols = nn.Unfold(kernel_size=(3, 2), dilation=(1, 2), padding=1, stride=(2, 1))
        self.kernel = nn.Linear(2 * 3 * 2, 3)                        # 3 output channels
        self.fold = nn.Fold(output_size=(4, 4), kernel_size=3, padding=1)
        self.head = nn.Linear(3 * 4 * 4, classes)

    def forward(self, x):
        c = self.cols(x)                                             # (N, 12, 4 * 4): 7x4 -> 4x4 windows
        h = torch.tanh(self.kernel(c.transpose(1, 2))).transpose(1, 2).reshape(x.shape[0], 3, 4, 4)
        u = torch.tanh(F.unfold(h, 3, padding=1))                    # (N, 27, 16)
        return self.head((self.fold(u) / 9).flatten(1))


class FoldStride(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 2)
        self.head = nn.Linear(3 * 4 * 5, classes)

    def forward(self, c):
        img = F.fold(c, output_size=(5, 6), kernel_size=(2, 3), stride=2, padding=1, dilation=(1, 2))
        return self.head(self.conv(img).flatten(1))
