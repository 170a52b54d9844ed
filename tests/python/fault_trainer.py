#!/usr/bin/python3
"""A Python MNIST trainer for tests/it_py_faults.sh: BATCHES batches of 32
in a fixed order, the whole model as one RemoteStage, each batch in
psd.attempts() (a batch psd lost runs again; one dropped from a sync round,
psd.RoundClosed, too: attempts runs it again, as ps-train does). Prints after every batch
`batch B version V` (the model version its step produced) and at the end
the client's retries and re-runs. --rank N: its trainer rank (default 1;
give each trainer its own: sync rounds, ssp clocks).

    fault_trainer.py ADDR DATA_DIR BATCHES [--rank N] [KEY=VALUE ...]   (config overrides)
"""
import sys

import torch
import torch.nn.functional as F

import psd
from mnist_trainer import load_mnist


def main():
    addr, data, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rest, rank = sys.argv[4:], 1
    if rest[:1] == ["--rank"]:
        rank, rest = int(rest[1]), rest[2:]
    overrides = dict(kv.split("=", 1) for kv in rest)
    torch.set_num_threads(1)
    client = psd.connect(addr, rank=rank, overrides=overrides)
    x, y = load_mnist(data, "train")
    net = psd.RemoteStage(None, client)
    for b in range(batches):
        i = (b * 32) % (len(x) - 32)
        # a batch psd lost, or one dropped from a sync round, runs again under a new context
        for ctx in psd.attempts(client):
            with ctx:
                loss = F.nll_loss(net(x[i:i + 32]), y[i:i + 32])
                loss.backward()
                r = ctx.step()
        print(f"batch {b} version {r.version} loss {loss.item():.4f}", flush=True)
    print(f"fault_trainer: {batches} batches, {client.retries} retries, {client.reruns} batches run again",
          flush=True)


if __name__ == "__main__":
    try:
        main()
    except psd.Error as e:
        sys.exit(f"fault_trainer: {e}")
