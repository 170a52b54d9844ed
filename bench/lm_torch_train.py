#!/usr/bin/python3
"""The quality anchor for `ps-train lm` (run by `make bench-lm`, bench/lm.sh):
train PyTorch's word_language_model-style RNNModel (Embedding ntoken x ninp,
dropout, 2-layer LSTM with dropout between layers, dropout, Linear nhid ->
ntoken; encoder and decoder weights uniform +-0.1, decoder bias 0) in one
process on the same corpus, with the same hyper-parameters as
configs/rnn_lm.yaml and ps-train lm (SGD lr 20 divided by 4 when validation
loss stops improving after an epoch, clip_grad_norm_ 0.25, bptt 35, batch 20,
dropout 0.2, hidden state carried across windows and detached), for STEPS
windows, then print the test perplexity over the whole test split
(evaluation batch 10, as the example and ps-train lm).

    lm_torch_train.py DATA_DIR STEPS SEED [NTOKEN NINP NHID]
STEPS "epoch" trains exactly one epoch (as `make run-lm`). LM_TORCH_DEVICE
(default cpu; e.g. cuda) runs the same model there: Debian's CPU PyTorch
trains at ~140-380 tokens/s here, an epoch in about an hour per seed.
Prints "torch train: seed S steps N test loss L test ppl P (X tokens/s)".

The corpus is read as ps-train lm reads it (trainer/lm_corpus.c): whitespace
tokens, <eos> at each line's end, the vocabulary from train.txt, <unk> for
words of valid/test.txt it lacks.
"""
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import os

data_dir, steps_arg, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
DEV = torch.device(os.environ.get("LM_TORCH_DEVICE", "cpu"))
V, E, H = (int(a) for a in (sys.argv[4:7] if len(sys.argv) >= 7 else (10000, 200, 200)))
BPTT, BATCH, EVAL_BATCH, LR, CLIP, DROPOUT, NLAYERS = 35, 20, 10, 20.0, 0.25, 0.2, 2

torch.manual_seed(seed)


def read(name):
    with open(f"{data_dir}/{name}", encoding="utf-8") as f:
        return [w for line in f for w in line.split() + ["<eos>"]]


train_w = read("train.txt")
vocab = {"<unk>": 0}
for w in train_w:
    vocab.setdefault(w, len(vocab))
if len(vocab) > V:
    sys.exit(f"lm_torch_train: vocabulary {len(vocab)} > ntoken {V}")


def ids(words):
    return torch.tensor([vocab.get(w, 0) for w in words], dtype=torch.long)


def batchify(t, n):
    rows = t.numel() // n
    return t[: rows * n].view(n, rows).t().contiguous()


train = batchify(ids(train_w), BATCH).to(DEV)
valid = batchify(ids(read("valid.txt")), EVAL_BATCH).to(DEV)
test = batchify(ids(read("test.txt")), EVAL_BATCH).to(DEV)
steps = (train.size(0) - 1 + BPTT - 1) // BPTT if steps_arg == "epoch" else int(steps_arg)


class RNNModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(DROPOUT)
        self.encoder = nn.Embedding(V, E)
        self.rnn = nn.LSTM(E, H, NLAYERS, dropout=DROPOUT)
        self.decoder = nn.Linear(H, V)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.drop(self.encoder(x)), hidden)
        return self.decoder(self.drop(out)), hidden


model = RNNModel().to(DEV)


def zero_hidden(n):
    return (torch.zeros(NLAYERS, n, H, device=DEV), torch.zeros(NLAYERS, n, H, device=DEV))


def evaluate(src):
    model.eval()
    total, hidden = 0.0, zero_hidden(src.size(1))
    with torch.no_grad():
        for i in range(0, src.size(0) - 1, BPTT):
            n = min(BPTT, src.size(0) - 1 - i)
            out, hidden = model(src[i:i + n], hidden)
            total += n * F.cross_entropy(out.view(-1, V), src[i + 1:i + 1 + n].reshape(-1)).item()
    return total / (src.size(0) - 1)


lr, best, done, t0 = LR, None, 0, time.perf_counter()
while done < steps:
    model.train()
    hidden = zero_hidden(BATCH)
    for i in range(0, train.size(0) - 1, BPTT):
        if done == steps:
            break
        n = min(BPTT, train.size(0) - 1 - i)
        hidden = tuple(h.detach() for h in hidden)
        model.zero_grad()
        out, hidden = model(train[i:i + n], hidden)
        loss = F.cross_entropy(out.view(-1, V), train[i + 1:i + 1 + n].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-lr)
        done += 1
    else:  # a whole epoch: validate and anneal as the example
        vl = evaluate(valid)
        if best is None or vl < best:
            best = vl
        else:
            lr /= 4.0
train_s = time.perf_counter() - t0
tl = evaluate(test)
print(f"torch train: seed {seed} steps {steps} test loss {tl:.4f} test ppl {math.exp(tl):.2f} "
      f"({steps * BPTT * BATCH / train_s:.0f} tokens/s training, {torch.get_num_threads()} threads, {DEV})", flush=True)
