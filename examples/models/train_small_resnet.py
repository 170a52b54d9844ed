#!/usr/bin/python3
"""train_small_resnet.py - PyTorch's local training loop for the small
ResNet (small_resnet.py) on Fashion-MNIST, the reference `make test-fit`
holds psd + `ps-train fit` to; and the check that a psd checkpoint loads
into the twin.

Train (what `ps-train fit` does through psd, on one process):

    /usr/bin/python3 examples/models/train_small_resnet.py \\
        --data /usr/share/datasets/fashion-mnist --epochs 3 --batch-size 64 \\
        --lr 0.05,0.05,0.005 --momentum 0.9 --seed 1

  IDX files (raw or .gz) read with numpy; inputs x / 255 normalised with
  --mean/--std (Fashion-MNIST's 0.2860 / 0.3530, as --input-mean/--input-std
  of ps-train fit); every epoch a fresh shuffle (torch.Generator seeded with
  --seed), batches of --batch-size (the last one smaller), F.cross_entropy,
  torch.optim.SGD(lr, momentum, weight_decay); then the test set in eval
  mode. Prints per epoch "epoch E training loss L" and at the end
      test loss 0.3012 accuracy 89.12% (8912/10000 samples)
  --lr with several values: one per epoch (the last repeats), applied as
  ps-train fit --lr applies them through psd (each Step's grad_scale): the
  optimizer keeps the first lr and the epoch's loss is scaled by lr / first
  lr, so momentum carries earlier steps in gradient units (exactly psd's
  SGD; torch.optim's own lr change would rescale the momentum buffer's next
  steps at once). --accumulate K: each optimizer step averages the
  gradients of K consecutive batches of --batch-size (loss / K each) - what
  psd's sync mode does with K trainers (server.sync_workers K,
  server.sync_reduce mean: each trainer's batch is one forward, their
  gradients averaged into one step; BatchNorm sees batches of --batch-size
  either way). --stale: each step's gradient is computed on the weights
  before the previous step (one step stale, as each of two hogwild trainers'
  is: the other's step lands between its Forward and its Step) - to tell
  hogwild's cost from a bug. One thread by default: on a shared 2-core machine the
  ops of a model this small run faster on one, and the result does not
  depend on the thread count.

Write the golden file `make test-fit` compares psd with (each seed trained
in turn; the recipe and the accuracies as JSON; its "regenerate" field is
the whole command):

    /usr/bin/python3 examples/models/train_small_resnet.py --seed 1 2 \\
        --lr 0.05,0.05,0.005 --accumulate 2 --golden tests/golden/fit_small_resnet.json

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
    """Eval-mode loss and accuracy on (x, y), printed; returns (loss, accuracy %)."""
    net.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            out = net(x[i:i + batch])
            loss += F.cross_entropy(out, y[i:i + batch], reduction="sum").item()
            correct += (out.argmax(1) == y[i:i + batch]).sum().item()
    n = len(x)
    print("test loss %.4f accuracy %.2f%% (%d/%d samples)" % (loss / n, 100.0 * correct / n, correct, n), flush=True)
    return loss / n, 100.0 * correct / n


def lr_list(v):
    lrs = [float(x) for x in v.split(",")]
    if not lrs or any(not x > 0 for x in lrs):
        raise argparse.ArgumentTypeError("--lr %s: one or more comma-separated values > 0" % v)
    return lrs


def train(a, seed, data, test):
    """One seed's local loop; returns (test loss, test accuracy %, seconds)."""
    xtr, ytr = data
    torch.manual_seed(seed)
    net = SmallResNet()
    opt = torch.optim.SGD(net.parameters(), lr=a.lr[0], momentum=a.momentum, weight_decay=a.weight_decay)
    g = torch.Generator().manual_seed(seed)
    t0 = time.time()
    prev = None
    for ep in range(a.epochs):
        net.train()
        scale = a.lr[min(ep, len(a.lr) - 1)] / a.lr[0]
        order = torch.randperm(len(xtr), generator=g)
        total, batches = 0.0, 0
        starts = list(range(0, len(xtr), a.batch_size))
        for j in range(0, len(starts), a.accumulate):
            group = starts[j:j + a.accumulate]
            opt.zero_grad()
            if a.stale:   # the gradient on the previous weights, applied to the current ones
                params = list(net.parameters())
                cur = [p.detach().clone() for p in params]
                if prev is not None:
                    with torch.no_grad():
                        for p, q in zip(params, prev):
                            p.copy_(q)
            for i in group:
                idx = order[i:i + a.batch_size]
                loss = F.cross_entropy(net(xtr[idx]), ytr[idx])
                (loss * (scale / len(group))).backward()
                total += loss.item()
                batches += 1
            if a.stale:
                with torch.no_grad():
                    for p, q in zip(params, cur):
                        p.copy_(q)
                prev = cur
            opt.step()
        print("seed %d epoch %d training loss %.4f (%d batches, %.0f s)" % (seed, ep + 1, total / batches, batches,
                                                                          time.time() - t0), flush=True)
    loss, acc = evaluate(net, *test)
    return loss, acc, time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=lr_list, default=[0.05], help="LR[,LR...]: one per epoch, the last repeats")
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--accumulate", type=int, default=1, help="batches whose mean gradient makes one step")
    ap.add_argument("--stale", action="store_true", help="gradients one step stale (as two hogwild trainers')")
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--seed", type=int, nargs="+", default=[1], help="one or more seeds, trained in turn")
    ap.add_argument("--mean", type=float, default=0.2860)
    ap.add_argument("--std", type=float, default=0.3530)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--limit", type=int, default=0, help="train on the first N samples only (quick checks)")
    ap.add_argument("--eval-checkpoint", help="load this psd checkpoint (strict=True) and evaluate it")
    ap.add_argument("--golden", help="write the recipe and each seed's test loss and accuracy to this JSON file")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    xte, yte = load(a.data, "t10k", a.mean, a.std)
    if a.eval_checkpoint:
        net = SmallResNet()
        net.load_state_dict(read_safetensors(a.eval_checkpoint), strict=True)
        print("loaded %s with strict=True" % a.eval_checkpoint)
        evaluate(net, xte, yte)
        return
    xtr, ytr = load(a.data, "train", a.mean, a.std)
    if a.limit:
        xtr, ytr = xtr[:a.limit], ytr[:a.limit]
    results = {}
    for seed in a.seed:
        loss, acc, secs = train(a, seed, (xtr, ytr), (xte, yte))
        results[str(seed)] = {"test_loss": round(loss, 4), "accuracy": round(acc, 2), "seconds": round(secs)}
    if a.golden:
        doc = {
            "about": "PyTorch's local loop for the small ResNet on Fashion-MNIST, the reference of make test-fit "
                     "(tests/fit/small_resnet.sh); written by examples/models/train_small_resnet.py",
            "regenerate": "/usr/bin/python3 examples/models/train_small_resnet.py --seed %s --golden %s%s" % (
                " ".join(str(x) for x in a.seed), a.golden,
                "".join(" --%s %s" % (k, v) for k, v in (("epochs", a.epochs), ("batch-size", a.batch_size),
                                                        ("lr", ",".join("%g" % x for x in a.lr)),
                                                        ("momentum", a.momentum), ("accumulate", a.accumulate)))
                + (" --stale" if a.stale else "")),
            "recipe": {"epochs": a.epochs, "batch_size": a.batch_size, "accumulate": a.accumulate, "stale": a.stale,
                       "lr": a.lr,
                       "momentum": a.momentum,
                       "weight_decay": a.weight_decay, "mean": a.mean, "std": a.std, "limit": a.limit},
            "torch": torch.__version__, "threads": a.threads,
            "seeds": results,
        }
        with open(a.golden, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")
        print("wrote %s" % a.golden)


if __name__ == "__main__":
    main()
