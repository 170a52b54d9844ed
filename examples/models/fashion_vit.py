#!/usr/bin/python3
"""A small vision transformer for Fashion-MNIST (1x28x28), as a user writes one: 7x7 patches (16 tokens of
64), a class token, torchvision's Encoder (a learned positional embedding, 2 pre-norm blocks of 4-head
nn.MultiheadAttention and a GELU MLP, a final LayerNorm), a linear head. docs/models.md ("A vision
transformer, trained") exports it with tools/psd-export and trains it through psd with ps-train fit.

    /usr/bin/python3 examples/models/fashion_vit.py [--epochs 2]   # PyTorch's own loop, for comparison
    /usr/bin/python3 examples/models/fashion_vit.py --eval-checkpoint CKPT   # psd's checkpoint, strict=True
"""
import argparse
import gzip
import time

import numpy as np
import torch
import torch.nn as nn
from torchvision.models.vision_transformer import Encoder


class FashionViT(nn.Module):
    def __init__(self, num_classes=10, dim=64):
        super().__init__()
        self.dim = dim
        self.conv_proj = nn.Conv2d(1, dim, 7, stride=7)
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.encoder = Encoder(seq_length=17, num_layers=2, num_heads=4, hidden_dim=dim, mlp_dim=2 * dim,
                               dropout=0.0, attention_dropout=0.0)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        n = x.shape[0]
        x = self.conv_proj(x).reshape(n, self.dim, 16).permute(0, 2, 1)   # (N, 16 patches, dim)
        x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1)     # the class token first
        x = self.encoder(x)
        return self.head(x[:, 0])


def idx(path, offset):
    return np.frombuffer(gzip.open(path).read(), np.uint8, offset=offset)


def main():
    ap = argparse.ArgumentParser(description="PyTorch's loop for FashionViT (Adam, cross entropy)")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-checkpoint", help="load this psd checkpoint (strict=True) and evaluate it")
    a = ap.parse_args()
    mean, std = 0.2860, 0.3530
    x = (torch.tensor(idx(a.data + "/train-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28) / 255.0,
                      dtype=torch.float32) - mean) / std
    y = torch.tensor(idx(a.data + "/train-labels-idx1-ubyte.gz", 8).astype(np.int64))
    xt = (torch.tensor(idx(a.data + "/t10k-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28) / 255.0,
                       dtype=torch.float32) - mean) / std
    yt = torch.tensor(idx(a.data + "/t10k-labels-idx1-ubyte.gz", 8).astype(np.int64))
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    m = FashionViT()
    if a.eval_checkpoint:
        from train_small_resnet import read_safetensors   # this folder's: json + numpy
        m.load_state_dict(read_safetensors(a.eval_checkpoint), strict=True)
        m.eval()
        with torch.no_grad():
            acc = (m(xt).argmax(1) == yt).float().mean().item()
        print("loaded %s with strict=True: test accuracy %.2f%%" % (a.eval_checkpoint, 100 * acc))
        return
    opt = torch.optim.Adam(m.parameters(), a.lr)
    t0 = time.time()
    for ep in range(a.epochs):
        m.train()
        perm = torch.randperm(len(x))
        for i in range(0, len(x), a.batch_size):
            b = perm[i:i + a.batch_size]
            opt.zero_grad()
            nn.functional.cross_entropy(m(x[b]), y[b]).backward()
            opt.step()
        m.eval()
        with torch.no_grad():
            acc = (m(xt).argmax(1) == yt).float().mean().item()
        print("epoch %d/%d test accuracy %.2f%% (%.0f s)" % (ep + 1, a.epochs, 100 * acc, time.time() - t0))


if __name__ == "__main__":
    main()
