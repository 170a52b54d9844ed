"""Text and feature models as users write them around reductions over a dim and the embedding options
(tests/export/check_textpool.py trains each through psd against PyTorch):

TextCNN    token ids -> nn.Embedding(padding_idx=0) -> Conv1d of widths 2, 3, 4 -> max over time as
           F.max_pool1d(h, h.size(2)).squeeze(2) (the window read from the shape) -> torch.cat -> nn.Linear.
MaxTokens  token ids -> nn.Embedding(padding_idx=-1) -> nn.Linear -> torch.max(h, dim=1)[0] and
           h.min(dim=1).values over the tokens, torch.amax(h, dim=-1, keepdim=True) over the features ->
           torch.cat -> nn.Linear.
Bags       token ids -> nn.EmbeddingBag of modes mean, sum (with padding_idx) and max -> torch.cat ->
           nn.Linear.
MaxRows    features (N, 4, 6) -> a Linear -> h.max(dim=2).values and torch.amin(h, (1, 2)) -> nn.Linear.

And for psd-export's refusals: BagWeights (an EmbeddingBag called with per_sample_weights), BagMeanPad (mode mean with
padding_idx), BagPadRow (a padding row that is not zeros), MaxNorm (nn.Embedding's max_norm), ArgMax (the
indices of x.max(dim) read).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 20


class TextCNN(nn.Module):
    def __init__(self, embed=8, filters=6, classes=4):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, embed, padding_idx=0)
        self.convs = nn.ModuleList([nn.Conv1d(embed, filters, k) for k in (2, 3, 4)])
        self.fc = nn.Linear(3 * filters, classes)

    def forward(self, ids):
        e = self.embed(ids).transpose(1, 2)
        hs = [F.relu(c(e)) for c in self.convs]
        hs = [F.max_pool1d(h, h.size(2)).squeeze(2) for h in hs]
        return self.fc(torch.cat(hs, 1))


class MaxTokens(nn.Module):
    def __init__(self, embed=8, hidden=10, classes=4, seq=7):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, embed, padding_idx=-1)
        self.proj = nn.Linear(embed, hidden)
        self.fc = nn.Linear(2 * hidden + seq, classes)

    def forward(self, ids):
        h = torch.tanh(self.proj(self.embed(ids)))                  # (N, T, H)
        top = torch.max(h, dim=1)[0]
        low = h.min(dim=1).values
        per_token = torch.amax(h, dim=-1, keepdim=True).flatten(1)  # (N, T)
        return self.fc(torch.cat([top, low, per_token], 1))


class Bags(nn.Module):
    def __init__(self, embed=6, classes=4):
        super().__init__()
        self.mean = nn.EmbeddingBag(VOCAB, embed, mode="mean")
        self.sum = nn.EmbeddingBag(VOCAB, embed, mode="sum", padding_idx=0)
        self.max = nn.EmbeddingBag(VOCAB, embed, mode="max")
        self.fc = nn.Linear(3 * embed, classes)

    def forward(self, ids):
        return self.fc(torch.cat([self.mean(ids), self.sum(ids), self.max(ids)], 1))


class MaxRows(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.fc = nn.Linear(4 + 1, classes)

    def forward(self, x):
        h = self.lin(x)                                             # (N, 4, 6)
        return self.fc(torch.cat([h.max(dim=2).values, torch.amin(h, (1, 2)).unsqueeze(1)], 1))


class BagWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(VOCAB, 4, mode="sum")
        self.weights = nn.Embedding(VOCAB, 1)

    def forward(self, ids):
        return self.bag(ids, per_sample_weights=self.weights(ids).squeeze(-1))


class BagMeanPad(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(VOCAB, 4, mode="mean", padding_idx=0)

    def forward(self, ids):
        return self.bag(ids)


class BagPadRow(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(VOCAB, 4, mode="sum", padding_idx=1)
        with torch.no_grad():
            self.bag.weight[1].fill_(0.5)

    def forward(self, ids):
        return self.bag(ids)


class MaxNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 4, max_norm=1.0)

    def forward(self, ids):
        return self.emb(ids).flatten(1)


class ArgMax(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 4)

    def forward(self, ids):
        v, i = self.emb(ids).max(dim=1)
        return v + i
