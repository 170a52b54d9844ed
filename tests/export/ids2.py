"""Recommender models of several int64 id inputs for tests/export/check_ids2.py (psd-export: psd's input is the
ids joined flat; each nn.Embedding / nn.EmbeddingBag called on an input an Embedding of its slice)."""
import torch
import torch.nn as nn

USERS, ITEMS, HIST = 11, 13, 5


class NCF(nn.Module):
    """NeuMF-style: user and item ids, a GMF part (the embeddings' product and its dot product) and an MLP part
    (other embeddings joined, two Linears), 4 logits (rating buckets)."""
    def __init__(self, dim=6):
        super().__init__()
        self.user_gmf = nn.Embedding(USERS, dim)
        self.item_gmf = nn.Embedding(ITEMS, dim)
        self.user_mlp = nn.Embedding(USERS, dim)
        self.item_mlp = nn.Embedding(ITEMS, dim)
        self.mlp = nn.Sequential(nn.Linear(2 * dim, 8), nn.ReLU(), nn.Linear(8, 4), nn.ReLU())
        self.head = nn.Linear(dim + 4 + 1, 4)

    def forward(self, user, item):
        gmf = self.user_gmf(user) * self.item_gmf(item)
        dot = gmf.sum(1, keepdim=True)
        mlp = self.mlp(torch.cat((self.user_mlp(user), self.item_mlp(item)), 1))
        return self.head(torch.cat((gmf, mlp, dot), 1))


class NCFX(NCF):
    """NCF on psd's one input, (N, 2) ids: user, item (the PyTorch reference of the check; the same state_dict)."""
    def forward(self, x):
        return super().forward(x[:, 0], x[:, 1])


class History(nn.Module):
    """A user id and a history of HIST item ids (0 pads): the user's row, the history's mean (nn.EmbeddingBag)
    and its rows in order (nn.Embedding with padding_idx 0, flattened), joined, a Linear; user.to(torch.long) an
    identity."""
    def __init__(self, dim=4):
        super().__init__()
        self.user = nn.Embedding(USERS, dim)
        self.bag = nn.EmbeddingBag(ITEMS, dim, mode="mean")
        self.items = nn.Embedding(ITEMS, dim, padding_idx=0)
        self.head = nn.Linear(dim * (2 + HIST), 3)

    def forward(self, user, hist):
        return self.head(torch.cat((self.user(user.to(torch.long)), self.bag(hist), self.items(hist).flatten(1)), 1))


class HistoryX(History):
    def forward(self, x):
        return super().forward(x[:, 0], x[:, 1:])


class SharedItems(nn.Module):
    """Three inputs - a user id, a candidate item id and a history of HIST item ids - one item table read at two
    sites (the candidate's row and the history's rows, their mean): psd's Embeddings of the two slices share it;
    user.long() an identity."""
    def __init__(self, dim=4):
        super().__init__()
        self.user = nn.Embedding(USERS, dim)
        self.items = nn.Embedding(ITEMS, dim)
        self.head = nn.Linear(3 * dim, 3)

    def forward(self, user, item, hist):
        return self.head(torch.cat((self.user(user.long()), self.items(item), self.items(hist).mean(1)), 1))


class SharedItemsX(SharedItems):
    def forward(self, x):
        return super().forward(x[:, 0], x[:, 1], x[:, 2:])


class IdArithmetic(nn.Module):
    """Refused: an id input read by something other than an embedding (user + 1)."""
    def __init__(self):
        super().__init__()
        self.user = nn.Embedding(USERS, 4)
        self.item = nn.Embedding(ITEMS, 4)

    def forward(self, user, item):
        return self.user(user + 1) * self.item(item)


class IdsJoined(nn.Module):
    """Refused: the id inputs joined by the module (torch.stack) before an embedding reads them."""
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(ITEMS, 4)

    def forward(self, user, item):
        return self.emb(torch.stack((user, item), 1)).flatten(1)
