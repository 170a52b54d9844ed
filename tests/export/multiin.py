"""Models of mixed inputs - int64 categorical ids and float32 dense features - for tests/export/check_multiin.py
(psd-export --input-dtype per input: psd's input is every input flattened and joined as float32, the ids exact
integers in it; each nn.Embedding / nn.EmbeddingBag called on an id input an Embedding of its slice, each float
input a Narrow)."""
import torch
import torch.nn as nn

USERS, ITEMS, CATS, FEATS, HIST = 11, 13, 5, 6, 4


class WideDeep(nn.Module):
    """Wide & deep: ids (user, item, category) and dense features; the wide part a Linear of the features, the
    deep part the three ids' rows joined with the features through an MLP; their sum: 2 logits."""
    def __init__(self, dim=4):
        super().__init__()
        self.user = nn.Embedding(USERS, dim)
        self.item = nn.Embedding(ITEMS, dim)
        self.cat = nn.Embedding(CATS, dim)
        self.wide = nn.Linear(FEATS, 2)
        self.deep = nn.Sequential(nn.Linear(3 * dim + FEATS, 16), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, ids, feats):
        e = torch.cat((self.user(ids[:, 0]), self.item(ids[:, 1]), self.cat(ids[:, 2])), 1)
        return self.wide(feats) + self.deep(torch.cat((e, feats), 1))


class WideDeepSplit(WideDeep):
    """WideDeep with its three ids as three inputs, the features between them: forward(self, user, feats, item,
    cat) - the join follows forward's order, ids and features interleaved."""
    def forward(self, user, feats, item, cat):
        e = torch.cat((self.user(user), self.item(item), self.cat(cat)), 1)
        return self.wide(feats) + self.deep(torch.cat((e, feats), 1))


class WideDeepSplitX(WideDeepSplit):
    """WideDeepSplit on psd's one input (N, 1 + FEATS + 2), the ids as float32: the check's PyTorch reference."""
    def forward(self, x):
        return super().forward(x[:, 0].long(), x[:, 1:1 + FEATS], x[:, 1 + FEATS].long(), x[:, 2 + FEATS].long())


class HistoryFeats(nn.Module):
    """A user id, a (2, 3) block of float features and a history of HIST item ids (0 pads): the user's row, the
    history's mean (nn.EmbeddingBag) and the features flattened, joined, a Linear: 3 logits (user.long())."""
    def __init__(self, dim=3):
        super().__init__()
        self.user = nn.Embedding(USERS, dim)
        self.bag = nn.EmbeddingBag(ITEMS, dim, mode="mean")
        self.head = nn.Linear(2 * dim + 6, 3)

    def forward(self, user, feats, hist):
        return self.head(torch.cat((self.user(user.long()), self.bag(hist), feats.flatten(1)), 1))


class HistoryFeatsX(HistoryFeats):
    def forward(self, x):
        return super().forward(x[:, 0].long(), x[:, 1:7].reshape(-1, 2, 3), x[:, 7:].long())


class IdTimesFeature(nn.Module):
    """Refused: an id input used as a number (ids * feats)."""
    def __init__(self):
        super().__init__()
        self.user = nn.Embedding(USERS, 4)
        self.lin = nn.Linear(FEATS, 4)

    def forward(self, ids, feats):
        return self.user(ids) + self.lin(feats) * ids.unsqueeze(1)


class WideDeepX(WideDeep):
    """WideDeep on psd's one input (N, 3 + FEATS), the ids as float32: the check's PyTorch reference."""
    def forward(self, x):
        return super().forward(x[:, :3].long(), x[:, 3:])


def synthetic(g, n):
    """n samples for WideDeep: ids (n, 3) int64, feats (n, FEATS) float32 N(0, 1), labels (n,) int64 - the user
    id's parity XOR the first feature's sign (neither part alone does better than chance; the deep part joins
    them) - as numpy arrays."""
    import numpy as np
    ids = np.stack([g.integers(0, USERS, n), g.integers(0, ITEMS, n), g.integers(0, CATS, n)], 1).astype(np.int64)
    feats = g.standard_normal((n, FEATS)).astype(np.float32)
    labels = ((ids[:, 0] % 2) ^ (feats[:, 0] > 0)).astype(np.int64)
    return ids, feats, labels
