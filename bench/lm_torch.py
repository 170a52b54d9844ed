#!/usr/bin/python3
"""PyTorch anchors for the language-model bench (bench/lm.sh): tokens/s of
word_language_model's RNNModel trained locally (forward, cross-entropy,
backward, clip_grad_norm_(0.25), SGD lr 20) at the given sizes on random
ids, single process - what the tutorial's RPC design can at best reach
with the same compute.

    lm_torch.py NTOKEN NINP NHID BPTT BATCH WINDOWS
Prints "torch local: N tokens/s (W windows)".
"""
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

V, E, H, T, N, W = (int(a) for a in sys.argv[1:7])
torch.manual_seed(0)
enc, rnn, dec = nn.Embedding(V, E), nn.LSTM(E, H, 2, dropout=0.2), nn.Linear(H, V)
drop = nn.Dropout(0.2)
params = list(enc.parameters()) + list(rnn.parameters()) + list(dec.parameters())
hidden = (torch.zeros(2, N, H), torch.zeros(2, N, H))
ids = torch.randint(0, V, (W + 1, T + 1, N))
for w in range(W + 1):
    if w == 1:
        t0 = time.perf_counter()  # the first window warms up
    hidden = tuple(h.detach() for h in hidden)
    out, hidden = rnn(drop(enc(ids[w, :-1])), hidden)
    loss = F.cross_entropy(dec(drop(out)).view(-1, V), ids[w, 1:].reshape(-1))
    for p in params:
        p.grad = None
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 0.25)
    with torch.no_grad():
        for p in params:
            p.add_(p.grad, alpha=-20)
dt = time.perf_counter() - t0
print(f"torch local: {W * T * N / dt:.0f} tokens/s ({W} windows, {torch.get_num_threads()} threads)")
