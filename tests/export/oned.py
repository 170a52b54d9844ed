"""1-d modules for tests/export/check_export.py: what psd-export writes for
Conv1d's padding='same', the functional 1-d pools, and what it refuses."""
import torch.nn as nn
import torch.nn.functional as F


class SameConv1d(nn.Module):          # (N, 3, 16)
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 4, 5, padding="same", dilation=2)
        self.valid = nn.Conv1d(4, 4, 3, padding="valid", bias=False)

    def forward(self, x):
        x = self.valid(self.conv(x))                                           # (N, 4, 14)
        x = F.avg_pool1d(x, 3, stride=2, padding=1, count_include_pad=False)   # (N, 4, 7)
        x = F.max_pool1d(x, 2, ceil_mode=True)                                 # (N, 4, 4)
        return F.adaptive_avg_pool1d(x, 3)                                     # (N, 4, 3)


class EvenSameConv1d(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 4, 4, padding="same")

    def forward(self, x):
        return self.conv(x)           # REFUSED_SAME


class DilatedMaxPool1d(nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = nn.MaxPool1d(2, dilation=2)

    def forward(self, x):
        return self.pool(x)           # REFUSED_DILATION
