#!/usr/bin/python3
"""train_small_resnet.py - PyTorch's local training loop for the small
ResNet (small_resnet.py) on Fashion-MNIST, the reference `make test-fit`
holds psd + `ps-train fit` to; and the check that a psd checkpoint loads
into the twin.

Train (what `ps-train fit` does through psd, on one process):

    /usr/bin/python3 examples/models/train_small_resnet.py \\
        --data /usr/share/datasets/fashion-mnist --epochs 3 --batch-size 64 \\
        --lr 0.05 --momentum 0.9 --seed 1

  IDX files (raw or .gz) read with numpy; inputs x / 255 normalised with
  --mean/--std (Fashion-MNIST's 0.2860 / 0.3530, as --input-mean/--input-std
  of ps-train fit); every epoch a fresh shuffle (torch.Generator seeded with
  --seed), batches of --batch-size (the last one smaller), F.cross_entropy,
  torch.optim.SGD(lr, momentum, weight_decay); then the test set in eval
  mode. Prints per epoch "epoch E training loss L" and at the end
      test loss 0.3012 accuracy 89.12% (8912/10000 samples)

Evaluate a checkpoint (psd's ckpt-<step>.safetensors):

    /usr/bin/python3 examples/models/train_small_resnet.py --data DIR \\
        --eval-checkpoint ckpt-000000002814.safetensors

  loads it with load_state_dict(strict=True) - every weight and BatchNorm
  buffer under its state_dict name, nothing missing or extra - and prints the
  test line the same way.
"""
import argparse
import gzip
import json
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from small_resnet import SmallResNet  # noqa: E402


def read_idx(path):
    raw = (gzip.open if path.endswith(".gz") else open)(path, "rb").read()
    if raw[0] != 0 or raw[1] != 0 or raw[2] != 8:
        raise SystemExit("%s: not an unsigned-byte IDX file" % path)
    nd = raw[3]
    dims = struct.unpack(">%dI" % nd, raw[4:4 + 4 * nd])
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * nd).reshape(dims)


def find(data, base):
    for name in (base, base + ".gz"):
        if os.path.exists(os.path.join(data, name)):
            return os.path.join(data, name)
    raise SystemExit("%s: no %s or %s.gz" % (data, base, base))


def load(data, split, mean, std):
    x = read_idx(find(data, "%s-images-idx3-ubyte" % split))
    y = read_idx(find(data, "%s-labels-idx1-ubyte" % split))
    x = (torch.from_numpy(x.astype(np.float32)) / 255.0 - mean) / std
    return x.unsqueeze(1), torch.from_numpy(y.astype(np.int64))


def read_safetensors(path):
    """A safetensors file as {name: tensor} with json + numpy (no extra package)."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    types = {"F32": np.float32, "F64": np.float64, "I64": np.int64}
    out = {}
    for k, v in header.items():
        b, e = v["data_offsets"]
        a = np.frombuffer(raw[8 + n + b:8 + n + e], types[v["dtype"]]).reshape(v["shape"])
        out[k] = torch.from_numpy(a.copy())
    return out


def evaluate(net, x, y, batch=1000):
    net.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            out = net(x[i:i + batch])
            loss += F.cross_entropy(out, y[i:i + batch], reduction="sum").item()
            correct += (out.argmax(1) == y[i:i + batch]).sum().item()
    n = len(x)
    print("test loss %.4f accuracy %.2f%% (%d/%d samples)" % (loss / n, 100.0 * correct / n, correct, n), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--mean", type=float, default=0.2860)
    ap.add_argument("--std", type=float, default=0.3530)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, default=0, help="train on the first N samples only (quick checks)")
    ap.add_argument("--eval-checkpoint", help="load this psd checkpoint (strict=True) and evaluate it")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    xte, yte = load(a.data, "t10k", a.mean, a.std)
    if a.eval_checkpoint:
        net = SmallResNet()
        net.load_state_dict(read_safetensors(a.eval_checkpoint), strict=True)
        print("loaded %s with strict=True" % a.eval_checkpoint)
        evaluate(net, xte, yte)
        return
    torch.manual_seed(a.seed)
    xtr, ytr = load(a.data, "train", a.mean, a.std)
    if a.limit:
        xtr, ytr = xtr[:a.limit], ytr[:a.limit]
    net = SmallResNet()
    opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=a.momentum, weight_decay=a.weight_decay)
    g = torch.Generator().manual_seed(a.seed)
    t0 = time.time()
    for ep in range(a.epochs):
        net.train()
        order = torch.randperm(len(xtr), generator=g)
        total, batches = 0.0, 0
        for i in range(0, len(xtr), a.batch_size):
            idx = order[i:i + a.batch_size]
            loss = F.cross_entropy(net(xtr[idx]), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
            batches += 1
        print("epoch %d training loss %.4f (%d batches, %.0f s)" % (ep + 1, total / batches, batches, time.time() - t0),
              flush=True)
    evaluate(net, xte, yte)


if __name__ == "__main__":
    main()
