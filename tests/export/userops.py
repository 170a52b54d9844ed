"""Models as users write them around ops beyond psd's kinds (reductions over a dim, the embedding options, shape moves)
(tests/export/check_userops.py trains each through psd against PyTorch):

TextCNN    token ids -> nn.Embedding(padding_idx=0) -> Conv1d of widths 2, 3, 4 -> max over time as
           F.max_pool1d(h, h.size(2)).squeeze(2) (the window read from the shape) -> torch.cat -> nn.Linear.
MaxTokens  token ids -> nn.Embedding(padding_idx=-1) -> nn.Linear -> torch.max(h, dim=1)[0] and
           h.min(dim=1).values over the tokens, torch.amax(h, dim=-1, keepdim=True) over the features ->
           torch.cat -> nn.Linear.
Bags       token ids -> nn.EmbeddingBag of modes mean, sum (with padding_idx) and max -> torch.cat ->
           nn.Linear.
MaxRows    features (N, 4, 6) -> a Linear -> h.max(dim=2).values and torch.amin(h, (1, 2)) -> nn.Linear.
ShapeMoves images (N, 1, 6, 6) -> nn.ZeroPad2d, Conv2d, nn.ConstantPad2d, nn.PixelShuffle, Conv2d,
           F.pixel_unshuffle, torch.stack with nn.Softmin of it, F.layer_norm(v, v.shape[-1:]), x.repeat ->
           nn.Linear.
PixelNet   images (N, 1, 6, 6) -> Conv2d, nn.PixelShuffle(2), Conv2d -> nn.Linear (through its ONNX export:
           DepthToSpace).

And for psd-export's refusals: BagWeights (an EmbeddingBag called with per_sample_weights), BagMeanPad (mode mean with
padding_idx), BagPadRow (a padding row that is not zeros), MaxNorm (nn.Embedding's max_norm), ArgMax (the
indices of x.max(dim) read), RepeatBatch (x.repeat along the batch), EinsumDot (an einsum that is not a
batched matrix product).
"""
import math

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



class ShapeMoves(nn.Module):
    """Super-resolution's nn.PixelShuffle and F.pixel_unshuffle, nn.ZeroPad2d and nn.ConstantPad2d, torch.stack,
    x.repeat, nn.Softmin and F.layer_norm(x, x.shape[-1:]) on (N, 1, 6, 6) images."""
    def __init__(self, classes=4):
        super().__init__()
        self.pad = nn.ZeroPad2d((1, 0, 2, 1))
        self.conv = nn.Conv2d(1, 8, 3)                               # (8, 7, 5)
        self.cpad = nn.ConstantPad2d((0, 1, 0, 1), 0.5)              # (8, 8, 6)
        self.up = nn.PixelShuffle(2)                                 # (2, 16, 12)
        self.mix = nn.Conv2d(2, 4, 3, stride=2, padding=1)           # (4, 8, 6)
        self.softmin = nn.Softmin(dim=1)
        self.fc = nn.Linear(2 * 192 + 3 * 16, classes)

    def forward(self, x):
        h = self.mix(self.up(self.cpad(self.conv(self.pad(x)))))
        d = F.pixel_unshuffle(h, 2)                                  # (16, 4, 3)
        s = torch.stack([d.flatten(1), self.softmin(d).flatten(1)], dim=1)   # (2, 192)
        r = F.layer_norm(d.mean((2, 3)), d.mean((2, 3)).shape[-1:]).unsqueeze(1).repeat(1, 3, 1)   # (3, 16)
        return self.fc(torch.cat([s.flatten(1), r.flatten(1)], 1))


class Expands(nn.Module):
    """A gate broadcast by expand_as and a value expanded past 64 copies, on (N, 5, 8) features."""
    def __init__(self, classes=4):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.g = nn.Linear(8, 1)
        self.out = nn.Linear(40 + 70, classes)

    def forward(self, x):
        g = torch.sigmoid(self.g(x.mean(1)))                      # (N, 1)
        h = self.fc(x) * g.unsqueeze(1).expand_as(x)              # (N, 5, 8)
        return self.out(torch.cat([h.flatten(1), g.expand(-1, 70)], 1))


class Einsums(nn.Module):
    """Two-head attention on (N, 6, 8) features written with torch.einsum: "bhqd,bhkd->bhqk", "bhqk,bhkd->bhqd",
    an output transposed ("...qd,...kd->...kq": B^T A^T) and a transposed operand ("bhdq,bhdk->bhqk")."""
    def __init__(self, classes=4):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.out = nn.Linear(48 + 72 + 72, classes)

    def forward(self, x):
        n = x.shape[0]
        q, k, v = (f(x).view(n, 6, 2, 4).transpose(1, 2) for f in (self.q, self.k, self.v))   # (N, 2, 6, 4)
        att = torch.softmax(torch.einsum("bhqd,bhkd->bhqk", q, k) * 0.5, dim=-1)
        o = torch.einsum("bhqk,bhkd->bhqd", att, v)
        o2 = torch.einsum("...qd,...kd->...kq", q, v)
        o3 = torch.einsum("bhdq,bhdk->bhqk", q.transpose(-1, -2), k.transpose(-1, -2))
        return self.out(torch.cat([o.flatten(1), o2.flatten(1), o3.flatten(1)], 1))


class Paddings(nn.Module):
    """CycleGAN's nn.ReflectionPad2d before a 7x7 convolution, convolutions with padding_mode replicate and
    circular, F.pad in reflect mode and nn.ReplicationPad2d, on (N, 1, 8, 8) images. circular=False: the third
    convolution pads with zeros (for the ONNX path: PyTorch 1.13's ONNX export of circular padding slices the
    wrong rows, pytorch/pytorch#86690, so its file is not the module)."""
    def __init__(self, classes=4, circular=True):
        super().__init__()
        self.pad = nn.ReflectionPad2d(3)
        self.c1 = nn.Conv2d(1, 4, 7)                                             # (4, 8, 8)
        self.c2 = nn.Conv2d(4, 4, 3, padding=1, padding_mode="replicate")
        self.c3 = nn.Conv2d(4, 4, 3, padding=(1, 2), padding_mode="circular" if circular else "zeros")  # (4, 8, 10)
        self.rep = nn.ReplicationPad2d((0, 1, 2, 0))                             # (4, 10, 11)
        self.fc = nn.Linear(4 * 11 * 14, classes)

    def forward(self, x):
        h = torch.relu(self.c1(self.pad(x)))
        h = torch.relu(self.c3(self.c2(h)))
        return self.fc(F.pad(self.rep(h), (1, 2, 0, 1), mode="reflect").flatten(1))   # (4, 11, 14)

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


class RepeatBatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        return self.fc(x).repeat(2, 1)


class EinsumDot(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 6)

    def forward(self, x):
        return torch.einsum("bi,bi->b", self.a(x), self.b(x)).unsqueeze(1)


class SoftsignNet(nn.Module):
    """nn.Softsign between two Linears: PyTorch 1.13 exports it as Abs, Add and a Div of computed values."""
    def __init__(self, classes=4):
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, classes)

    def forward(self, x):
        return self.b(nn.functional.softsign(self.a(x)))


class PixelNet(nn.Module):
    """pytorch/examples' super_resolution shape: a convolution to r^2 x the channels, nn.PixelShuffle(2) (ONNX's
    DepthToSpace in mode CRD), a convolution, a Linear head."""
    def __init__(self, classes=4):
        super().__init__()
        self.c1, self.up, self.c2 = nn.Conv2d(1, 8, 3, padding=1), nn.PixelShuffle(2), nn.Conv2d(2, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 12 * 12, classes)

    def forward(self, x):
        return self.fc(nn.functional.relu(self.c2(self.up(torch.tanh(self.c1(x))))).flatten(1))


class MyLinear(nn.Module):
    """A custom layer holding its own weight and bias, calling F.linear."""
    def __init__(self, i, o):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(o, i) / i ** 0.5)
        self.bias = nn.Parameter(torch.zeros(o))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class MyConv(nn.Module):
    """A custom convolution: F.conv2d with its own weight and bias, stride, padding, dilation as keywords."""
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 2, 3, 3) * 0.2)
        self.bias = nn.Parameter(torch.zeros(4))

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, stride=1, padding=2, dilation=2)


class Functional(nn.Module):
    """Functional layers with module parameters: a custom F.conv2d layer, F.conv1d without bias over the rows,
    F.linear of an nn.Linear's own weight and bias called twice (one node's parameters, shared), a custom
    F.linear layer."""
    def __init__(self):
        super().__init__()
        self.conv = MyConv()
        self.c1 = nn.Conv1d(4, 4, 3, bias=False)
        self.lin = nn.Linear(8, 8)
        self.head = MyLinear(8, 4)

    def forward(self, x):
        h = torch.tanh(self.conv(x))                          # (N, 4, 6, 6)
        h = F.conv1d(h.flatten(2), self.c1.weight, padding=1)  # (N, 4, 36)
        h = h.mean(1).view(-1, 4, 9)[:, :, :8].mean(1)        # (N, 8)
        h = torch.tanh(F.linear(h, self.lin.weight, self.lin.bias))
        h = torch.tanh(F.linear(h, self.lin.weight, self.lin.bias))
        return self.head(h)


class LinearT(nn.Module):
    """Refused: F.linear with a transposed parameter (a tied autoencoder's decoder)."""
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(6, 3)

    def forward(self, x):
        return F.linear(torch.relu(self.enc(x)), self.enc.weight.t())


class LinearNamed(nn.Module):
    """Refused: F.linear with parameters psd cannot name <node>.weight / <node>.bias."""
    def __init__(self):
        super().__init__()
        self.W = nn.Parameter(torch.randn(4, 6))

    def forward(self, x):
        return F.linear(x, self.W)


class ZerosState(nn.Module):
    """Refused by torch.fx itself (torch.zeros of a traced size): psd-export names the line."""
    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(6, 4)

    def forward(self, x):
        h = torch.zeros(x.size(0), 4)
        return self.cell(x, h)


class MyEmbedding(nn.Module):
    """A custom embedding table read by F.embedding (padding_idx 0: that row gets no gradient)."""
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(VOCAB, 6))

    def forward(self, ids):
        return F.embedding(ids, self.weight, padding_idx=0)


class FuncEmbedding(nn.Module):
    """Token ids through a custom F.embedding layer, a sum over the tokens, F.linear of a head's parameters."""
    def __init__(self):
        super().__init__()
        self.emb = MyEmbedding()
        self.head = nn.Linear(6, 4)

    def forward(self, ids):
        return F.linear(self.emb(ids).sum(1), self.head.weight, self.head.bias)


class ReturnsEarlier(nn.Module):
    """forward returns a value computed before another (unused) one: the output is `a`'s, not the last
    computed `b`'s, and b's tensors are named as unread."""
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 3), nn.Linear(3, 2)

    def forward(self, x):
        y = self.a(x)
        self.b(y)
        return y


class TwoViews(nn.Module):
    """Two images through one convolutional encoder (its parameters shared), joined, a head: forward takes
    two inputs (psd's input is them joined along dim 1, (2, 6, 6) per sample)."""
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.Tanh(), nn.AdaptiveAvgPool2d(2), nn.Flatten())
        self.head = nn.Linear(32, 4)

    def forward(self, input1, input2):
        return self.head(torch.cat((self.enc(input1), self.enc(input2)), 1))


class TwoViewsX(TwoViews):
    """TwoViews on psd's one input (the PyTorch reference of the check; the same state_dict)."""
    def forward(self, x):
        return super().forward(x[:, 0:1], x[:, 1:2])


class ImageAndFeatures(nn.Module):
    """An image and a feature vector of other shapes (psd's input is them flattened and joined: 36 + 5)."""
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.feat = nn.Linear(5, 4)
        self.head = nn.Linear(8, 4)

    def forward(self, img, feats):
        return self.head(torch.cat((torch.tanh(self.conv(img)).mean((2, 3)), torch.tanh(self.feat(feats))), 1))


class ImageAndFeaturesX(ImageAndFeatures):
    def forward(self, x):
        return super().forward(x[:, :36].reshape(-1, 1, 6, 6), x[:, 36:])


class BilinearNet(nn.Module):
    """nn.Bilinear of two views of the input (two Linears), then a head; a second Bilinear over (3, 2) rows of
    the input against itself."""
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 4), nn.Linear(6, 3)
        self.bl = nn.Bilinear(4, 3, 5)
        self.rows = nn.Bilinear(2, 2, 2, bias=False)
        self.head = nn.Linear(11, 4)

    def forward(self, x):
        h = torch.tanh(self.bl(self.a(x), self.b(x)))
        r = self.rows(x.view(-1, 3, 2), torch.tanh(x).view(-1, 3, 2)).flatten(1)
        return self.head(torch.cat((h, r), 1))


def bert_gelu(x):
    """The GELU of BERT-era code, written with erf."""
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


class ErfGelu(nn.Module):
    """A hand-written GELU (torch.erf) between two Linears, and torch.special.erf of a feature."""
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 8), nn.Linear(8, 4)

    def forward(self, x):
        return self.b(bert_gelu(self.a(x))) + torch.special.erf(x[:, :4])
