"""small_resnet.py - a small residual CNN for 1x28x28 images and 10 classes,
the PyTorch twin of examples/models/small_resnet.yaml (psd's model file):
the same layers under the same state_dict names, so a psd checkpoint loads
into it with strict=True and a PyTorch state_dict initialises psd.

    stem    conv 3x3 1->8 (no bias), BatchNorm2d, ReLU, MaxPool2d 2    -> 8x14x14
    layer1  residual block 8->8:  conv-BN-ReLU-conv-BN + x, ReLU        -> 8x14x14
    layer2  residual block 8->16, stride 2, 1x1 conv+BN shortcut        -> 16x7x7
    head    AdaptiveAvgPool2d(1), flatten, Linear 16->10 (logits)

About 0.46 M multiply-adds per image forward, 5,122 parameters (3 epochs
of Fashion-MNIST train in minutes on 2 cores); it outputs logits: train it
with cross_entropy.
Used by examples/models/train_small_resnet.py and `make test-fit`.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """A basic residual block: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.shortcut is None else self.shortcut(x)))


class SmallResNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.layer1 = Block(8, 8, 1)
        self.layer2 = Block(8, 16, 2)
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = self.layer2(self.layer1(x))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


if __name__ == "__main__":
    net = SmallResNet()
    for k, v in net.state_dict().items():
        print("%-32s %-14s %s" % (k, str(v.dtype).replace("torch.", ""), tuple(v.shape)))
    print("parameters:", sum(p.numel() for p in net.parameters()))
