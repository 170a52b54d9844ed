"""Modules psd-export must refuse, each for one reason (tests/it_export.sh
checks the message names the culprit and its source line), and some it takes."""
import torch
import torch.nn as nn


class UsesMatmul(nn.Module):           # a function outside the table
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        return torch.matmul(y, y.t())   # REFUSED_MATMUL


class Shared(nn.Module):               # a module with buffers other than BatchNorm's called twice
    def __init__(self):
        super().__init__()
        self.fc = with_buffer(nn.Linear(4, 4))

    def forward(self, x):
        return self.fc(torch.relu(self.fc(x)))   # REFUSED_SHARED


class DirectParameter(nn.Module):      # a parameter used in forward itself
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return self.fc(x) * torch.sigmoid(self.scale)   # REFUSED_PARAM


class UnknownModule(nn.Module):        # a leaf module outside the table
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.LPPool1d(2, 2)

    def forward(self, x):
        return self.act(self.fc(x))      # REFUSED_MODULE


class SharedActivation(nn.Module):     # a module without parameters called twice: two nodes
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.fc2(self.act(self.fc1(x))))


def make_shared_activation():          # a function returning the module
    return SharedActivation()


class HardActivations(nn.Module):      # mobilenet_v2/v3's activations, as modules and as functions
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.r6 = nn.ReLU6(inplace=True)
        self.ht = nn.Hardtanh(-2, 3)
        self.hs = nn.Hardswish()
        self.hg = nn.Hardsigmoid()

    def forward(self, x):
        x = self.hg(self.hs(self.ht(self.r6(self.fc(x)))))
        f = nn.functional
        return f.hardtanh(f.hardsigmoid(f.hardswish(f.hardtanh(f.relu6(x), 0.5, 2.5))))


class SqueezeExcite(nn.Module):        # squeeze-and-excitation: a Mul of (N, C, 1, 1) by (N, C, H, W)
    def __init__(self):
        super().__init__()
        self.fc = nn.Conv2d(4, 4, 1)

    def forward(self, x):
        return torch.sigmoid(self.fc(nn.functional.adaptive_avg_pool2d(x, 1))) * x


class ScaleByConstant(nn.Module):      # a Mul by a number: MulConstant
    def forward(self, x):
        return x * 0.5                   # REFUSED_CONSTANT


from torchvision.ops import stochastic_depth  # noqa: E402 (here: the refusals' lines above stay put)


class ResidualDrop(nn.Module):         # torchvision's stochastic depth, module and function: StochasticDepth,
    def __init__(self, p=0.2):         # the identity at p 0 and outside training
        super().__init__()
        import torchvision.ops
        self.fc = nn.Linear(4, 4)
        self.drop = torchvision.ops.StochasticDepth(p, "row")
        self.p = p

    def forward(self, x):
        y = self.drop(self.fc(x)) + x
        y = stochastic_depth(y, 0.3 if self.p else 0.0, "batch", self.training) + y
        return stochastic_depth(y, 0.5, "row", False) + y


def residual_drop_off():
    return ResidualDrop(0.0)


class AdaptivePools(nn.Module):        # vgg's and alexnet's adaptive pools to more than 1x1, module and function
    def __init__(self):
        super().__init__()
        self.grow = nn.AdaptiveAvgPool2d(7)
        self.keep_h = nn.AdaptiveAvgPool2d((None, 3))

    def forward(self, x):
        return nn.functional.adaptive_avg_pool2d(self.keep_h(self.grow(x)), (2, 5))


class SpatialMean(nn.Module):          # mnasnet's x.mean([2, 3]): AdaptiveAvgPool2d (+ Flatten)
    def forward(self, x):
        return torch.mean(x, (-1, -2), keepdim=True) + x.mean([2, 3]).view(x.size(0), -1, 1, 1)


class MeanOverFeatures(nn.Module):     # a mean over the batch (x.mean(1), one value per sample, is taken)
    def forward(self, x):
        return x.mean(0)                 # REFUSED_MEAN


class CeilPools(nn.Module):            # squeezenet's and googlenet's ceil_mode pools
    def __init__(self):
        super().__init__()
        self.mp = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.ap = nn.AvgPool2d(3, 2, padding=1, count_include_pad=False, ceil_mode=True)

    def forward(self, x):
        F = nn.functional
        return F.avg_pool2d(F.max_pool2d(self.ap(self.mp(x)), 2, ceil_mode=True), 2, ceil_mode=True)


class LayerScaled(nn.Module):          # convnext's block: permutes, F.layer_norm of a module's own weight
    def __init__(self):                # and bias (torchvision's LayerNorm2d), a layer scale
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1, groups=4)
        self.norm = nn.LayerNorm(4)
        self.fc = nn.Linear(4, 4)
        self.block = Scaled()

    def forward(self, x):
        y = self.norm(self.conv(x).permute(0, 2, 3, 1))
        y = torch.permute(self.fc(y), (0, -1, 1, 2))
        return self.block(y) + x


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(4)
        self.layer_scale = nn.Parameter(torch.full((4, 1, 1), 0.5))

    def forward(self, x):
        x = nn.functional.layer_norm(x.permute(0, 2, 3, 1), self.ln.normalized_shape, self.ln.weight,
                                     self.ln.bias, 1e-6).permute(0, 3, 1, 2)
        return self.layer_scale * x


class PermuteBatch(nn.Module):         # a permute moving the batch
    def forward(self, x):
        return x.permute(1, 0)           # REFUSED_PERMUTE


class ScaleTwice(nn.Module):           # a parameter multiplied in at two sites
    def __init__(self):
        super().__init__()
        self.inner = nn.Module()
        self.inner.gamma = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return self.inner.gamma * (self.inner.gamma * x)   # REFUSED_SCALE_TWICE


class DenseJoin(nn.Module):            # densenet's torch.cat of a growing list: of one tensor, the identity
    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(2 + 2 * i, 2, 1) for i in range(3))

    def forward(self, x):
        feats = [x]
        for conv in self.convs:
            feats.append(conv(torch.cat(feats, 1)))
        return torch.cat(feats, 1)


from torchvision.models.shufflenetv2 import channel_shuffle  # noqa: E402


class ShuffleUnit(nn.Module):          # shufflenet_v2's unit: chunk, a branch, cat, channel_shuffle
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 1)
        self.mix = nn.ChannelShuffle(2)

    def forward(self, x):
        a, b = x.chunk(2, dim=1)
        y = channel_shuffle(torch.cat((a, self.conv(b)), dim=1), 2)
        c, d, e = torch.split(self.mix(y), [1, 2, 1], 1)
        return torch.cat((e, d, c), 1)


class TinyViT(nn.Module):              # vit's pieces: shape unpacking, _assert, a reshape of computed sizes, the
    def __init__(self):                # class token expanded and joined, the positional embedding added,
        super().__init__()             # self-attention, token 0
        self.proj = nn.Conv2d(2, 4, 2, stride=2)
        self.class_token = nn.Parameter(torch.zeros(1, 1, 4))
        self.enc = nn.Module()
        self.enc.pos = nn.Parameter(torch.zeros(1, 5, 4))
        self.attn = nn.MultiheadAttention(4, 2, batch_first=True)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        n, c, h, w = x.shape
        torch._assert(h == 4, "4x4 images")
        torch._assert(x.dim() == 4, "images")
        x = self.proj(x).reshape(n, 4, (h // 2) * (w // 2)).permute(0, 2, 1)
        x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1)
        x = x + self.enc.pos
        x, _ = self.attn(x, x, x, need_weights=False)
        return self.head(x[:, 0])


class AssertFails(nn.Module):          # a torch._assert false at the exported shape
    def forward(self, x):
        torch._assert(x.shape[1] == 5, "five features")   # REFUSED_ASSERT
        return torch.relu(x)


class AttentionWeights(nn.Module):     # the attention weights read
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(4, 1, batch_first=True)

    def forward(self, x):
        y, w = self.attn(x, x, x)   # REFUSED_WEIGHTS
        return y + w.sum()


class CrossAttention(nn.Module):       # query and key/value different tensors
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(4, 1, batch_first=True)
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.attn(x, self.fc(x), x)[0]   # REFUSED_CROSS
class Products(nn.Module):             # attention's pieces: torch.bmm, @, torch.matmul, Tensor.matmul, transposes
    def __init__(self):                # (one fused into its product, one read twice), numbers, softmax(-1), view
        super().__init__()             # of computed sizes
        self.fc = nn.Linear(4, 6)

    def forward(self, x):                          # (N, 3, 4)
        n, t, c = x.shape
        y = self.fc(x)                             # (N, 3, 6)
        a = 0.25 * torch.bmm(y, y.transpose(1, 2))
        z = torch.matmul(a.softmax(-1), y) / 2     # (N, 3, 6)
        zt = z.transpose(-1, -2)                   # (N, 6, 3)
        w = zt.matmul(z) + zt @ z                  # (N, 6, 6)
        return w.reshape(n, 2, t * c + 6)          # (N, 2, 18)


class ProductBroadcast(nn.Module):     # (N, 1, 3, 4) @ (N, 4, 3): numpy faces the batch with a dim of the other
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):                          # (N, 3, 4)
        y = self.fc(x)
        n = x.size(0)
        return torch.matmul(y.reshape(n, 1, 3, 4), y.transpose(1, 2))  # REFUSED_BROADCAST


class TransposeBatch(nn.Module):       # x.transpose(0, 1): the batch moves
    def forward(self, x):
        return x.transpose(0, 1)                   # REFUSED_TRANSPOSE_BATCH


class DivideByTensor(nn.Module):       # a tensor divided by one of another rank (numpy would face the batch)
    def forward(self, x):
        return x / x.unsqueeze(1)                  # REFUSED_DIVIDE


class ShiftedWindows(nn.Module):      # swin's steps as a user writes them (exported, not refused)
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):             # (N, 5, 6, 3)
        x = nn.functional.pad(self.fc(x), (0, 0, 0, 2, 0, 1))           # (N, 6, 8, 3)
        x = torch.roll(x, shifts=(-1, 2), dims=(1, 2))
        x = x.roll(3, -2)
        y = torch.cat([x[..., 0::2, 0::2, :], x[..., 1::2, 1::2, :]], -1)   # (N, 3, 4, 6)
        return y[:, :2, 1, 4:]


class RollFlattened(nn.Module):
    def forward(self, x):
        return torch.roll(x, 1)       # REFUSED_ROLL


class PadCrop(nn.Module):
    def forward(self, x):
        return nn.functional.pad(x, (-1, 1), mode="reflect")   # REFUSED_PAD


def with_buffer(m):
    """m with a buffer of its own (Shared: buffers other than BatchNorm's; defined last, keeping the line numbers
    check_export.py names)."""
    m.register_buffer("scale", torch.ones(4))
    return m
