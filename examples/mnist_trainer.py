#!/usr/bin/python3
"""The trainer of PyTorch's RPC parameter-server tutorial
(https://pytorch.org/tutorials/intermediate/rpc_param_server_tutorial.html),
against psd instead of a PyTorch parameter server.

The tutorial's TrainerNet forwards every batch to the ParameterServer's
Net with rpc_sync, runs dist_autograd.backward and a DistributedOptimizer
step in a dist_autograd context. Here psd hosts the Net (model mnist_cnn:
stages conv and fc) and its SGD; TrainerNet's forward is a psd.RemoteStage,
the context a psd context, and ctx.step() the optimizer step:

    psd --config configs/local.yaml &
    PYTHONPATH=python examples/mnist_trainer.py --config configs/local.yaml --rank 1 &
    PYTHONPATH=python examples/mnist_trainer.py --config configs/local.yaml --rank 2

(or `ps-train` for one of the ranks: they train the same model together.)
MNIST comes from IDX files (scripts/fetch-mnist.sh data/mnist), normalised
as the tutorial's transforms.Normalize((0.1307,), (0.3081,)).
"""
import argparse
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import psd


def load_mnist(data_dir, split):
    """(images (n, 1, 28, 28) normalised, labels (n,)) of an IDX split ("train" or "t10k")."""
    def idx(name):
        with open(os.path.join(data_dir, name), "rb") as f:
            raw = f.read()
        _, _, ndim = struct.unpack(">HBB", raw[:4])
        dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
        return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)
    x = torch.from_numpy(idx(f"{split}-images-idx3-ubyte").astype(np.float32) / 255.0)
    y = torch.from_numpy(idx(f"{split}-labels-idx1-ubyte").astype(np.int64))
    return ((x - 0.1307) / 0.3081).unsqueeze(1), y


class TrainerNet(nn.Module):
    """The tutorial's TrainerNet: the Net lives on the parameter server."""

    def __init__(self, client, split=False):
        super().__init__()
        if split:   # the tutorial's two-device split, each half a stage on psd
            self.param_server = nn.Sequential(psd.RemoteStage("conv", client), psd.RemoteStage("fc", client))
        else:       # the whole Net, one call (as the tutorial's remote_method(ParameterServer.forward, ...))
            self.param_server = psd.RemoteStage(None, client)

    def forward(self, x):
        return self.param_server(x)


def get_accuracy(test_loader, model, rank):
    model.eval()
    correct_sum = 0
    with torch.no_grad():
        for data, target in test_loader:
            out = model(data)
            pred = out.argmax(dim=1, keepdim=True)
            correct_sum += pred.eq(target.view_as(pred)).sum().item()
    n = len(test_loader.dataset)
    print(f"Rank {rank} accuracy: {100.0 * correct_sum / n:.2f}% ({correct_sum}/{n} test images)", flush=True)


def run_training_loop(args, client, train_loader, test_loader):
    net = TrainerNet(client, split=args.split)
    rank, samples, t0, b = args.rank, 0, None, 0
    one = args.one_call and not args.split and not args.check_gradients
    if args.one_call and not one:
        print(f"Rank {rank}: --one-call needs the whole Net (no --split) and no --check-gradients; "
              "this run sends Forward, Backward and Step", flush=True)
    for epoch in range(args.epochs):
        for i, (data, target) in enumerate(train_loader):
            if b == args.max_batches:
                break
            if b == args.warmup:
                t0, samples = time.perf_counter(), 0
            for ctx in psd.attempts(client):     # a batch psd lost (a restart) runs again
                with ctx:
                    if one:                      # the loss (the NLL of log-probabilities), backward and step on psd
                        loss, _ = net.param_server.train_step(data, target)
                    else:
                        model_output = net(data)
                        loss = F.nll_loss(model_output, target)
                        loss.backward()
                        if args.check_gradients:     # the tutorial's get_dist_gradients check
                            assert ctx.gradients() != {}
                        ctx.step()
            if i % args.log_every == 0:
                print(f"Rank {rank} training batch {i} loss {loss.item():.6f}", flush=True)
            samples += len(data)
            b += 1
    secs = time.perf_counter() - t0 if t0 else 0.0
    print("Training complete!")
    print(f"Rank {rank}: {samples} samples in {secs:.1f} s ({samples / secs if secs else 0:.0f} samples/s)",
          flush=True)
    if client.retries:
        print(f"Rank {rank}: {client.retries} RPC retries")
    if not args.no_eval:
        get_accuracy(test_loader, net, rank)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--config", default="configs/local.yaml", help="the YAML psd and ps-train read")
    p.add_argument("--server", help="psd's address (overrides server.address)")
    p.add_argument("--rank", type=int, default=1, help="this trainer's rank, 1.. (default 1)")
    p.add_argument("--data", default="data/mnist", help="directory with the MNIST IDX files")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-batches", type=int, default=-1, help="stop after N batches")
    p.add_argument("--warmup", type=int, default=0, help="batches before the samples/s timing starts")
    p.add_argument("--seed", type=int, default=0, help="shuffling; each rank adds its rank")
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--split", action="store_true", help="conv and fc as two RemoteStages (the tutorial's split)")
    p.add_argument("--check-gradients", action="store_true", help="fetch each batch's gradients (get_dist_gradients)")
    p.add_argument("--one-call", action="store_true", help="a batch in one call: psd computes the loss, its backward "
                   "and the step (RemoteStage.train_step; as ps-train's default)")
    p.add_argument("--no-eval", action="store_true", help="no test-set accuracy at the end")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    args = p.parse_args()
    torch.set_num_threads(1)
    overrides = dict(kv.split("=", 1) for kv in args.set)
    client = psd.connect(args.config, rank=args.rank, server=args.server, overrides=overrides)
    x, y = load_mnist(args.data, "train")
    tx, ty = load_mnist(args.data, "t10k")
    g = torch.Generator().manual_seed(args.seed + args.rank)
    train_loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True, generator=g)
    test_loader = DataLoader(TensorDataset(tx, ty), batch_size=500)
    run_training_loop(args, client, train_loader, test_loader)


if __name__ == "__main__":
    try:
        main()
    except psd.Error as e:
        sys.exit(f"mnist_trainer: {e}")
