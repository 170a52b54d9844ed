#!/usr/bin/python3
"""PyTorch's examples/vae model (pytorch/examples, vae/main.py), verbatim: a variational autoencoder for MNIST,
784-400-(20, 20)-400-784, z = mu + eps * std with eps = torch.randn_like(std), returning (recon, mu, logvar).
docs/fit.md ("A variational autoencoder") exports it with tools/psd-export - psd's output is the three joined,
824 values per sample - and trains it through psd with `ps-train fit --loss vae_bce --labels inputs`: the
example's loss_function (binary cross-entropy of the recon, summed, plus the KL divergence) per sample.

    /usr/bin/python3 examples/models/vae.py [--epochs 2] [--max-batches N]   # PyTorch's own loop, for comparison
    /usr/bin/python3 examples/models/vae.py --eval-checkpoint CKPT   # psd's checkpoint, strict=True, test loss
"""
import argparse
import gzip
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class VAE(nn.Module):
    def __init__(self):
        super(VAE, self).__init__()

        self.fc1 = nn.Linear(784, 400)
        self.fc21 = nn.Linear(400, 20)
        self.fc22 = nn.Linear(400, 20)
        self.fc3 = nn.Linear(20, 400)
        self.fc4 = nn.Linear(400, 784)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5*logvar)
        eps = torch.randn_like(std)
        return mu + eps*std

    def decode(self, z):
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 784))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


def loss_function(recon_x, x, mu, logvar):
    """The example's loss (reconstruction + KL divergence, summed over the batch), per sample here as
    `ps-train fit --loss vae_bce` reports it."""
    BCE = F.binary_cross_entropy(recon_x, x.view(-1, 784), reduction='sum')
    KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return (BCE + KLD) / x.shape[0]


def images(path):
    """An IDX image file (gzip'ed or not) as float32 (N, 1, 28, 28) in [0, 1], as fit scales uint8 inputs."""
    raw = open(path, "rb").read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return (np.frombuffer(raw, np.uint8, offset=16).reshape(-1, 1, 28, 28) / 255.0).astype(np.float32)


def find(data, name):
    for p in (os.path.join(data, name), os.path.join(data, name + ".gz")):
        if os.path.exists(p):
            return p
    raise SystemExit("no %s in %s (scripts/fetch-mnist.sh data/mnist)" % (name, data))


def test_loss(m, xt):
    """The per-sample loss over xt in eval mode (which samples z too, as the example's test() does)."""
    m.eval()
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(xt), 1000):
            b = xt[i:i + 1000]
            recon, mu, logvar = m(b)
            total += float(loss_function(recon, b, mu, logvar)) * len(b)
    return total / len(xt)


def main():
    ap = argparse.ArgumentParser(description="PyTorch's loop for the VAE (Adam, the example's loss per sample)")
    ap.add_argument("--data", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data",
                                                   "mnist"))
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--max-batches", type=int, default=0, help="stop each epoch after N batches (as ps-train's)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--test-samples", type=int, default=0, help="evaluate on the first N test images (0: all)")
    ap.add_argument("--eval-checkpoint", help="load this psd checkpoint (strict=True) and evaluate it")
    a = ap.parse_args()
    x = torch.from_numpy(images(find(a.data, "train-images-idx3-ubyte")))
    xt = torch.from_numpy(images(find(a.data, "t10k-images-idx3-ubyte")))
    xt = xt[:a.test_samples] if a.test_samples else xt
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    m = VAE()
    if a.eval_checkpoint:
        from train_small_resnet import read_safetensors   # this folder's: json + numpy
        m.load_state_dict(read_safetensors(a.eval_checkpoint), strict=True)
        print("loaded %s with strict=True: test loss %.4f" % (a.eval_checkpoint, test_loss(m, xt)))
        return
    opt = torch.optim.Adam(m.parameters(), a.lr)
    t0 = time.time()
    for ep in range(a.epochs):
        m.train()
        perm = torch.randperm(len(x))
        total, seen = 0.0, 0
        for k, i in enumerate(range(0, len(x), a.batch_size)):
            if a.max_batches and k >= a.max_batches:
                break
            b = x[perm[i:i + a.batch_size]]
            opt.zero_grad()
            recon, mu, logvar = m(b)
            loss = loss_function(recon, b, mu, logvar)
            loss.backward()
            opt.step()
            total += float(loss) * len(b)
            seen += len(b)
        print("epoch %d/%d train loss %.4f test loss %.4f (%.0f s)" % (ep + 1, a.epochs, total / seen,
                                                                      test_loss(m, xt), time.time() - t0))


if __name__ == "__main__":
    main()
