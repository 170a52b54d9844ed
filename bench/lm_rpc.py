#!/usr/bin/python3
"""The tutorial's design as the language-model bench's anchor (bench/lm.sh):
pytorch/examples distributed/rpc/rnn re-implemented at our sizes. A PS
worker owns an EmbeddingTable (Embedding ntoken x ninp, dropout) and a
Decoder (dropout, Linear nhid -> ntoken); each trainer holds a 2-layer LSTM
and runs every window as the tutorial does: under a dist_autograd context,
rpc_sync the ids to the embedding table, the LSTM here, rpc_sync its output
to the decoder and get the logits back, cross-entropy here,
dist_autograd.backward across the three, and one DistributedOptimizer (SGD)
step over the local and remote parameters (RRefs). CPU only (the tutorial
puts the table on CUDA), random ids as the tutorial feeds random tensors,
the tutorial's lr 0.05 and no clipping (DistributedOptimizer has none).
As in the tutorial, each trainer's model creates its own table and decoder
on the PS (rpc.remote): several trainers sharing one would fail, since one
trainer's in-place SGD step invalidates the weights another's autograd
saved; the PS process serves them all.

    lm_rpc.py TRAINERS NTOKEN NINP NHID BPTT BATCH WINDOWS
Prints "torch rpc: N tokens/s (K trainers, W windows each)": the tokens of
all trainers over the slowest trainer's time, the first window of each
excluded (warm-up).
"""
import os
import random
import sys
import time

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.distributed.optim import DistributedOptimizer
from torch.distributed.rpc import RRef

K, V, E, H, T, N, W = (int(a) for a in sys.argv[1:8])
NLAYERS, DROPOUT = 2, 0.2


class EmbeddingTable(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(DROPOUT)
        self.encoder = nn.Embedding(V, E)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)

    def forward(self, ids):
        return self.drop(self.encoder(ids))


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(DROPOUT)
        self.decoder = nn.Linear(H, V)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, out):
        return self.decoder(self.drop(out))


def on_owner(method, rref, *args):
    return method(rref.local_value(), *args)


def remote_call(method, rref, *args):
    return rpc.rpc_sync(rref.owner(), on_owner, args=(method, rref) + args)


def param_rrefs(rref):
    return [RRef(p) for p in rref.local_value().parameters()]


def trainer(rank, results):
    torch.manual_seed(rank)
    emb, dec = rpc.remote("ps", EmbeddingTable), rpc.remote("ps", Decoder)
    rnn = nn.LSTM(E, H, NLAYERS, dropout=DROPOUT)
    params = (rpc.rpc_sync("ps", param_rrefs, args=(emb,)) + [RRef(p) for p in rnn.parameters()]
              + rpc.rpc_sync("ps", param_rrefs, args=(dec,)))
    opt = DistributedOptimizer(optim.SGD, params, lr=0.05)
    hidden = (torch.zeros(NLAYERS, N, H), torch.zeros(NLAYERS, N, H))
    data = torch.randint(0, V, (W + 1, T + 1, N))
    for w in range(W + 1):
        if w == 1:
            t0 = time.perf_counter()
        with dist_autograd.context() as ctx:
            hidden = tuple(h.detach() for h in hidden)
            e = remote_call(EmbeddingTable.forward, emb, data[w, :-1])
            out, hidden = rnn(e, hidden)
            logits = remote_call(Decoder.forward, dec, out)
            loss = F.cross_entropy(logits.view(-1, V), data[w, 1:].reshape(-1))
            dist_autograd.backward(ctx, [loss])
            opt.step(ctx)
    results.put((W * T * N, time.perf_counter() - t0))


def worker(rank, port, results):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    name = "ps" if rank == 0 else f"trainer{rank}"
    rpc.init_rpc(name, rank=rank, world_size=K + 1,
                 rpc_backend_options=rpc.TensorPipeRpcBackendOptions(rpc_timeout=600))
    if rank > 0:
        trainer(rank, results)
    rpc.shutdown()


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.spawn(worker, args=(random.randint(20000, 40000), results), nprocs=K + 1, join=True)
    got = [results.get() for _ in range(K)]
    print(f"torch rpc: {sum(g[0] for g in got) / max(g[1] for g in got):.0f} tokens/s "
          f"({K} trainers, {W} windows each, {torch.get_num_threads()} threads)")
