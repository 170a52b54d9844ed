#!/usr/bin/python3
"""The trainer of PyTorch's model-parallel RNN tutorial (pytorch/examples
distributed/rpc/rnn), against psd, trained as word_language_model trains
its RNNModel.

The tutorial's RNNModel keeps the EmbeddingTable and the Decoder on a
parameter server (rpc.remote) and its nn.LSTM here; a dist_autograd context
and a DistributedOptimizer train all three. Here psd hosts the embedding
(stage "emb"), the decoder ("decoder") and the LSTM's weights (the
parameter-only stage "rnn", model rnn_lm); the LSTM runs here as a
psd.HostedModule: psd's weights come in when psd's version moved on, its
gradients go to psd with the step. Clipping is clip_grad_norm_(0.25) over
every parameter, remote and local (ctx.clip_grad_norm_); the lr (SGD,
optimizer.lr) is divided by 4 when validation stops improving, through the
step's grad_scale (plain SGD).

    scripts/fetch-fortunes.sh data/fortunes
    psd --config configs/rnn_lm.yaml &
    PYTHONPATH=python examples/rnn_trainer.py --config configs/rnn_lm.yaml --rank 1 &
    PYTHONPATH=python examples/rnn_trainer.py --config configs/rnn_lm.yaml --rank 2

The corpus is read as ps-train lm reads it (train/valid/test.txt; the
vocabulary in order of first appearance in train.txt, <eos> at each line's
end, <unk> for unknown words), so its ids and printed lines match ps-train
lm's. --decoder logits (default) is the tutorial's design: the decoder's
logits come here and the loss is computed here; --decoder fused lets psd
compute the loss (RemoteStage.cross_entropy), as ps-train lm's default.
"""
import argparse
import math
import os
import re
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import psd

EVAL_BATCH = 10   # word_language_model's eval_batch_size


class Corpus:
    """train/valid/test.txt as ps-train lm reads them (common/lm_corpus.h)."""

    def __init__(self, path):
        self.ids, self.words = {}, []
        self.train = self.tokenize(os.path.join(path, "train.txt"), add=True)
        self.unk = self.add(b"<unk>")
        self.valid = self.tokenize(os.path.join(path, "valid.txt"))
        self.test = self.tokenize(os.path.join(path, "test.txt"))

    def add(self, w):
        if w not in self.ids:
            self.ids[w] = len(self.words)
            self.words.append(w)
        return self.ids[w]

    def tokenize(self, path, add=False):
        with open(path, "rb") as f:
            data = f.read()
        lines = data.split(b"\n")
        if data.endswith(b"\n"):
            lines.pop()
        out = []
        for line in lines:
            for w in re.split(rb"[ \t\r\f\v]+", line):
                if w:
                    out.append(self.add(w) if add else self.ids.get(w, self.unk))
            out.append(self.add(b"<eos>") if add else self.ids[b"<eos>"])
        return torch.tensor(out, dtype=torch.int64)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data[:nbatch * bsz].view(bsz, -1).t().contiguous()


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len]


class RNNModel(nn.Module):
    """The tutorial's RNNModel: EmbeddingTable and Decoder on psd, the LSTM here."""

    def __init__(self, client, dropout):
        super().__init__()
        shapes = {p["name"]: p for p in client.parameters}
        enc = shapes["encoder.weight"]
        self.ntoken = enc["rows_total"] or enc["shape"][0]
        ninp = enc["shape"][1]
        nlayers = 1 + max(int(n[len("rnn.weight_hh_l"):]) for n in shapes if n.startswith("rnn.weight_hh_l"))
        nhid = shapes["rnn.weight_hh_l0"]["shape"][1]
        self.emb_table = psd.RemoteStage("emb", client)
        self.rnn = psd.HostedModule(nn.LSTM(ninp, nhid, nlayers, dropout=dropout), "rnn", client)
        self.decoder = psd.RemoteStage("decoder", client)
        self.nlayers, self.nhid = nlayers, nhid

    def forward(self, input, hidden):
        emb = self.emb_table(input)
        output, hidden = self.rnn(emb, hidden)
        return self.decoder(output), hidden

    def loss(self, input, target, hidden, fused):
        """Cross-entropy of the window and the new hidden state; fused: psd computes it."""
        if not fused:
            output, hidden = self(input, hidden)
            return F.cross_entropy(output.view(-1, self.ntoken), target.reshape(-1)), hidden
        output, hidden = self.rnn(self.emb_table(input), hidden)
        return self.decoder.cross_entropy(output, target), hidden

    def init_hidden(self, bsz):
        return (torch.zeros(self.nlayers, bsz, self.nhid), torch.zeros(self.nlayers, bsz, self.nhid))


def evaluate(model, source, bptt):
    model.eval()
    total, hidden = 0.0, model.init_hidden(EVAL_BATCH)
    with torch.no_grad():
        for i in range(0, source.size(0) - 1, bptt):
            data, targets = get_batch(source, i, bptt)
            output, hidden = model(data, hidden)
            total += len(data) * EVAL_BATCH * F.cross_entropy(output.view(-1, model.ntoken), targets.reshape(-1)).item()
    return total / ((source.size(0) - 1) * EVAL_BATCH)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/rnn_lm.yaml")
    p.add_argument("--server", help="psd's address (overrides server.address)")
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--world-size", type=int, help="psd + trainers (trainer.world_size); each trainer takes 1/(world_size-1) of train.txt")
    p.add_argument("--data", help="corpus directory (trainer.data)")
    p.add_argument("--batch-size", type=int, help="columns of the batchified stream (trainer.batch_size)")
    p.add_argument("--bptt", type=int, default=35)
    p.add_argument("--clip", type=float, default=0.25)
    p.add_argument("--epochs", type=int)
    p.add_argument("--max-batches", type=int, default=-1, help="windows at most per epoch")
    p.add_argument("--seed", type=int, help="the LSTM's dropout (trainer.seed); each rank adds its rank")
    p.add_argument("--log-every", type=int)
    p.add_argument("--decoder", choices=("logits", "fused"), default="logits")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    args = p.parse_args()
    torch.set_num_threads(1)
    client = psd.connect(args.config, rank=args.rank, server=args.server,
                         overrides=dict(kv.split("=", 1) for kv in args.set))
    cfg = lambda key, default: cfg_get(client, key, default)  # noqa: E731
    world = args.world_size or int(cfg("trainer.world_size", 3))
    bs = args.batch_size or int(cfg("trainer.batch_size", 20))
    epochs = args.epochs or int(cfg("trainer.epochs", 1))
    log_every = args.log_every or int(cfg("trainer.log_every", 200))
    seed = args.seed if args.seed is not None else int(cfg("trainer.seed", 0))
    lr0 = lr = float(cfg("optimizer.lr", 20))
    torch.manual_seed(seed * 1000003 + args.rank)
    corpus = Corpus(args.data or cfg("trainer.data", "data/fortunes"))
    model = RNNModel(client, dropout=float(cfg("model.sizes.dropout", 0.2)))
    if len(corpus.words) > model.ntoken:
        sys.exit(f"rnn_trainer: a vocabulary of {len(corpus.words)} words does not fit psd's ntoken {model.ntoken}")
    per = len(corpus.train) // (world - 1)
    train = batchify(corpus.train[per * (args.rank - 1):per * args.rank], bs)
    valid, test = batchify(corpus.valid, EVAL_BATCH), batchify(corpus.test, EVAL_BATCH)
    fused = args.decoder == "fused"
    best_val, t_start, tokens = None, time.perf_counter(), 0
    for epoch in range(1, epochs + 1):
        model.train()
        hidden = model.init_hidden(bs)
        nbatches = (train.size(0) - 1 + args.bptt - 1) // args.bptt
        total_loss, start = 0.0, time.perf_counter()
        for batch, i in enumerate(range(0, train.size(0) - 1, args.bptt)):
            if batch == args.max_batches:
                break
            data, targets = get_batch(train, i, args.bptt)
            for ctx in psd.attempts(client):        # a window psd lost runs again from the same state
                with ctx:
                    loss, new_hidden = model.loss(data, targets, hidden, fused)
                    loss.backward()
                    ctx.clip_grad_norm_(args.clip)  # over the LSTM here and psd's emb and decoder
                    ctx.step(grad_scale=lr / lr0)   # the lr schedule (plain SGD)
            hidden = tuple(h.detach() for h in new_hidden)
            total_loss += loss.item()
            tokens += data.numel()
            if (batch + 1) % log_every == 0:
                cur, ms = total_loss / log_every, (time.perf_counter() - start) * 1000 / log_every
                print(f"| epoch {epoch:3d} | {batch + 1:5d}/{nbatches:5d} batches | lr {lr:02.2f} | ms/batch {ms:5.2f} "
                      f"| loss {cur:5.2f} | ppl {math.exp(cur):8.2f} | rank {args.rank}", flush=True)
                total_loss, start = 0.0, time.perf_counter()
        val_loss = evaluate(model, valid, args.bptt)
        print(f"| end of epoch {epoch:3d} | valid loss {val_loss:5.2f} | valid ppl {math.exp(val_loss):8.2f} "
              f"| rank {args.rank}", flush=True)
        if best_val is None or val_loss < best_val:
            best_val = val_loss
        else:
            lr /= 4.0
    secs = time.perf_counter() - t_start
    print(f"Rank {args.rank}: {tokens} tokens in {secs:.1f} s ({tokens / secs:.0f} tokens/s)", flush=True)
    test_loss = evaluate(model, test, args.bptt)
    counts = torch.bincount(corpus.train, minlength=len(corpus.words)).double() + 1
    uni = -torch.log(counts[test[1:].reshape(-1)] / counts.sum()).mean().item()
    print(f"| End of training | test loss {test_loss:5.2f} | test ppl {math.exp(test_loss):8.2f} | unigram test ppl "
          f"{math.exp(uni):8.2f} | ratio {math.exp(test_loss - uni):.3f} | rank {args.rank}", flush=True)


def cfg_get(client, key, default):
    v = client.cfg.get(key, None)
    return default if v is None else v


if __name__ == "__main__":
    try:
        main()
    except psd.Error as e:
        sys.exit(f"rnn_trainer: {e}")
