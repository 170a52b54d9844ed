#!/usr/bin/python3
"""Load psd's rnn_lm checkpoint into PyTorch's RNNModel and evaluate it.

    lm_check.py CKPT.safetensors CORPUS_DIR NLAYERS BPTT

RNNModel is word_language_model's LSTM model (encoder Embedding, dropout,
nn.LSTM(ninp, nhid, nlayers, dropout), dropout, decoder Linear) - the
tutorial's EmbeddingTable + LSTM + Decoder in one module, with the same
state_dict names. load_state_dict(strict=True) must accept the checkpoint
as it is. The corpus is read as word_language_model's data.py reads it,
except that the vocabulary comes from train.txt with <unk> for the rest
(the README's rule). Prints "test loss X ppl Y" of the eval pass
(batch size 10, hidden state carried, as evaluate() in main.py).
"""
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, 'scripts')
from gen_golden import read_safetensors  # noqa: E402


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.2):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nlayers, self.nhid = nlayers, nhid

    def forward(self, x, hidden):
        emb = self.drop(self.encoder(x))
        out, hidden = self.rnn(emb, hidden)
        return self.decoder(self.drop(out)), hidden

    def init_hidden(self, bsz):
        z = torch.zeros(self.nlayers, bsz, self.nhid)
        return (z, z.clone())


def tokens(path, vocab, grow):
    ids = []
    with open(path, encoding='utf-8') as f:
        for line in f:
            for w in line.split() + ['<eos>']:
                if w not in vocab:
                    if not grow:
                        w = '<unk>'
                    else:
                        vocab[w] = len(vocab)
                ids.append(vocab[w])
    return ids


def main():
    ckpt, corpus, nlayers, bptt = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    sd, _ = read_safetensors(ckpt)
    ntoken, ninp = sd['encoder.weight'].shape
    nhid = sd['decoder.weight'].shape[1]
    model = RNNModel(ntoken, ninp, nhid, nlayers)
    model.load_state_dict(sd, strict=True)
    model.eval()
    vocab = {}
    tokens(f'{corpus}/train.txt', vocab, True)
    vocab.setdefault('<unk>', len(vocab))
    test = torch.tensor(tokens(f'{corpus}/test.txt', vocab, False), dtype=torch.int64)
    bsz = 10
    nb = test.size(0) // bsz
    data = test[:nb * bsz].view(bsz, -1).t().contiguous()
    total, count = 0.0, 0
    hidden = model.init_hidden(bsz)
    with torch.no_grad():
        for i in range(0, data.size(0) - 1, bptt):
            n = min(bptt, data.size(0) - 1 - i)
            x, y = data[i:i + n], data[i + 1:i + 1 + n]
            out, hidden = model(x, hidden)
            total += F.cross_entropy(out.view(-1, ntoken), y.reshape(-1), reduction='sum').item()
            count += y.numel()
    loss = total / count
    print(f"pytorch RNNModel (strict load of {len(sd)} tensors): test loss {loss:.6f} ppl {math.exp(loss):.4f}")


if __name__ == '__main__':
    main()
