#!/usr/bin/python3
"""A convolutional autoencoder for Fashion-MNIST (1x28x28), as a user writes one: two strided 3x3
convolutions down to 32x7x7, two stride-2 transposed convolutions (output_padding 1) back up to 1x28x28, a
sigmoid. docs/models.md ("A convolutional autoencoder, trained") exports it with tools/psd-export and trains
it through psd with ps-train fit and the mse loss, the images as their own targets (--labels inputs).

    /usr/bin/python3 examples/models/conv_autoencoder.py [--epochs 2]    # PyTorch's own loop, for comparison
    /usr/bin/python3 examples/models/conv_autoencoder.py --eval-checkpoint CKPT   # psd's checkpoint, strict=True
"""
import argparse
import gzip
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class ConvAutoencoder(nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.enc1 = nn.Conv2d(1, width, 3, stride=2, padding=1)                          # (16, 14, 14)
        self.enc2 = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1)                  # (32, 7, 7)
        self.dec1 = nn.ConvTranspose2d(2 * width, width, 3, stride=2, padding=1, output_padding=1)   # (16, 14, 14)
        self.dec2 = nn.ConvTranspose2d(width, 1, 3, stride=2, padding=1, output_padding=1)           # (1, 28, 28)

    def forward(self, x):
        x = F.relu(self.enc1(x))
        x = F.relu(self.enc2(x))
        x = F.relu(self.dec1(x))
        return torch.sigmoid(self.dec2(x))


def images(path):
    """An IDX image file (gzip'ed or not) as float32 (N, 1, 28, 28) in [0, 1], as fit scales uint8 inputs."""
    raw = open(path, "rb").read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return (np.frombuffer(raw, np.uint8, offset=16).reshape(-1, 1, 28, 28) / 255.0).astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description="PyTorch's loop for ConvAutoencoder (Adam, mean squared error)")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-checkpoint", help="load this psd checkpoint (strict=True) and evaluate it")
    a = ap.parse_args()
    x = torch.from_numpy(images(a.data + "/train-images-idx3-ubyte.gz"))
    xt = torch.from_numpy(images(a.data + "/t10k-images-idx3-ubyte.gz"))
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    m = ConvAutoencoder()
    if a.eval_checkpoint:
        from train_small_resnet import read_safetensors   # this folder's: json + numpy
        m.load_state_dict(read_safetensors(a.eval_checkpoint), strict=True)
        m.eval()
        with torch.no_grad():
            loss = F.mse_loss(m(xt), xt).item()
        print("loaded %s with strict=True: test mse %.5f" % (a.eval_checkpoint, loss))
        return
    opt = torch.optim.Adam(m.parameters(), a.lr)
    t0 = time.time()
    for ep in range(a.epochs):
        m.train()
        perm = torch.randperm(len(x))
        for i in range(0, len(x), a.batch_size):
            b = perm[i:i + a.batch_size]
            opt.zero_grad()
            F.mse_loss(m(x[b]), x[b]).backward()
            opt.step()
        m.eval()
        with torch.no_grad():
            loss = F.mse_loss(m(xt), xt).item()
        print("epoch %d/%d test mse %.5f (%.0f s)" % (ep + 1, a.epochs, loss, time.time() - t0))


if __name__ == "__main__":
    main()
