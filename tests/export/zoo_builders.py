"""torchvision models with what psd draws itself switched off, for
tests/export/check_resnet.py (psd-export takes them as FILE.py:NAME): psd
draws its own dropout masks, so a training forward equals PyTorch's only
with dropout off, and these builders have no argument for it. And models of
kinds torchvision has none of (conv1d_net)."""
import torch
import torchvision
import torchvision.ops


def efficientnet_b0(**kwargs):
    """efficientnet_b0 with its classifier's Dropout at p 0 (stochastic_depth_prob is an argument)."""
    m = torchvision.models.efficientnet_b0(**kwargs)
    m.classifier[0].p = 0.0
    return m


def efficientnet_v2_s(**kwargs):
    """efficientnet_v2_s with its classifier's Dropout at p 0."""
    m = torchvision.models.efficientnet_v2_s(**kwargs)
    m.classifier[0].p = 0.0
    return m


def _drawn_head(m):
    """torchvision starts a VisionTransformer's head and class token at zeros: every gradient before the
    head would be 0, and the class token's too. Small draws make each one non-zero."""
    with torch.no_grad():
        m.heads.head.weight.normal_(0, 0.05)
        m.heads.head.bias.normal_(0, 0.05)
        m.class_token.normal_(0, 0.5)
    return m


def vit_small(**kwargs):
    """torchvision's VisionTransformer at a size make test-zoo trains in seconds (vit_b_16 has 86M
    parameters): 32x32 images in 8x8 patches, 2 encoder layers of 4 heads over 64 dims, an MLP of 128."""
    kw = dict(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128)
    kw.update(kwargs)
    return _drawn_head(torchvision.models.VisionTransformer(**kw))


def vit_b_16(**kwargs):
    """torchvision's vit_b_16 (86M parameters; check_resnet.py vit_b_16 by hand, both ways ~5 min: not in
    make test-zoo) with its head and class token drawn."""
    return _drawn_head(torchvision.models.vit_b_16(**kwargs))


def swin_small(**kwargs):
    """torchvision's SwinTransformer (swin_t's code) at a size make test-zoo trains in seconds: 40x40 images in
    4x4 patches (10x10 tokens), 3 stages of 2 blocks over 16, 32 and 64 dims (2, 2 and 4 heads), 4x4 windows,
    stochastic depth off. Every path of swin_t at 64x64 shows: the 10x10 and 5x5 grids padded to the window
    (12, 8) with the shifted blocks' Roll and mask, the 5x5 grid padded to 6 by the patch merging, and at 3x3
    (one window) no shift, as torchvision decides."""
    kw = dict(patch_size=[4, 4], embed_dim=16, depths=[2, 2, 2], num_heads=[2, 2, 4], window_size=[4, 4],
              stochastic_depth_prob=0.0)
    kw.update(kwargs)
    return torchvision.models.SwinTransformer(**kw)


def swin_t(**kwargs):
    """torchvision's swin_t (28M parameters; check_resnet.py swin_t by hand at 64x64, not in make test-zoo) with
    its stochastic depth off (swin_t fixes stochastic_depth_prob at 0.2: no argument for it)."""
    m = torchvision.models.swin_t(**kwargs)
    for mod in m.modules():
        if isinstance(mod, torchvision.ops.StochasticDepth):
            mod.p = 0.0
    return m


class Conv1dNet(torch.nn.Module):
    """A 1-D CNN over (N, C, L) sequences as time-series and audio users write one: Conv1d with padding,
    BatchNorm1d, ReLU, MaxPool1d; a strided, dilated, grouped Conv1d without bias, AvgPool1d with padding
    (count_include_pad=False, ceil_mode), F.max_pool1d, AdaptiveAvgPool1d to 1 and a Linear head."""

    def __init__(self, in_channels=3, num_classes=10):
        super().__init__()
        nn = torch.nn
        self.conv1 = nn.Conv1d(in_channels, 16, 5, padding=2)
        self.bn1 = nn.BatchNorm1d(16)
        self.pool1 = nn.MaxPool1d(2)
        self.conv2 = nn.Conv1d(16, 32, 3, stride=2, dilation=2, groups=4, bias=False)
        self.bn2 = nn.BatchNorm1d(32)
        self.pool2 = nn.AvgPool1d(3, stride=2, padding=1, count_include_pad=False, ceil_mode=True)
        self.conv3 = nn.Conv1d(32, 32, 3, padding=1)   # padding="same": PyTorch 1.13 exports no ONNX of it
        self.gap = nn.AdaptiveAvgPool1d(1)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x):
        x = self.pool1(torch.relu(self.bn1(self.conv1(x))))
        x = self.pool2(torch.relu(self.bn2(self.conv2(x))))
        x = torch.nn.functional.max_pool1d(torch.relu(self.conv3(x)), 2, ceil_mode=True)
        return self.fc(torch.flatten(self.gap(x), 1))


def conv1d_net(**kwargs):
    return Conv1dNet(**kwargs)


class EltwiseNet(torch.nn.Module):
    """A network of elementwise math as users write it in their own layers: ELU, Mish, a - b, Softplus with
    beta and threshold, x + c, sqrt, clamp with min only, squeeze, SELU, abs, log, logsigmoid, x ** 2, -x,
    exp, c - x, clamp, square, rsqrt, unsqueeze, global max pooling, glu; (3, 16, 16) images."""

    def __init__(self, num_classes=10):
        super().__init__()
        nn = torch.nn
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.act1 = nn.ELU(0.8)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.sp = nn.Softplus(beta=2.0)      # threshold 20: PyTorch exports no other to ONNX
        self.fc1 = nn.Linear(16, 64)
        self.fc2 = nn.Linear(32, 32)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x):
        F = torch.nn.functional
        x = self.act1(self.conv1(x))
        x = x - F.mish(self.conv2(x))
        x = torch.sqrt(self.sp(x) + 0.5).clamp(min=0.9)
        x = (F.adaptive_avg_pool2d(x, 1) + F.adaptive_max_pool2d(x, 1)).squeeze(-1).squeeze(-1)
        h = F.selu(F.glu(self.fc1(x), dim=-1))
        h = torch.log(h.abs() + 1.0) - F.logsigmoid(h)
        h = 1.0 - torch.exp(-h.pow(2))
        h = self.fc2(h).clamp(-2.0, 2.0) * torch.rsqrt(h.square() + 1.0)
        return self.fc(h.unsqueeze(1)).squeeze(1)


def eltwise_net(**kwargs):
    return EltwiseNet(**kwargs)


class PReLUNet(torch.nn.Module):
    """Learned and shrinking activations PyTorch exports to ONNX (both of psd's paths): nn.PReLU per channel
    over blocked convolutions and with one slope, CELU, tanhshrink (Sub of Tanh in ONNX), nn.RReLU with
    lower = upper (one slope: PyTorch and psd draw the same; RandomUniformLike + PRelu in ONNX), F.rrelu
    outside training (LeakyReLU), PReLU per feature of (N, C) vectors; (3, 16, 16) images."""

    def __init__(self, num_classes=10):
        super().__init__()
        nn = torch.nn
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.prelu1 = nn.PReLU(16)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.prelu2 = nn.PReLU(init=0.1)
        self.celu = nn.CELU(0.7)
        self.fc1 = nn.Linear(16, 32)
        self.rrelu = nn.RReLU(0.2, 0.2)
        self.fc2 = nn.Linear(32, 32)
        self.prelu3 = nn.PReLU(32)
        self.fc = nn.Linear(32, num_classes)
        with torch.no_grad():   # slopes of their own (PyTorch's are all 0.25), some above 1, some negative
            for p in (self.prelu1, self.prelu3):
                p.weight.copy_(torch.linspace(-0.5, 1.5, p.weight.numel()))

    def forward(self, x):
        F = torch.nn.functional
        x = self.prelu1(self.conv1(x))
        x = self.celu(self.prelu2(self.conv2(x)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        h = self.fc1(x)
        h = F.tanhshrink(self.rrelu(F.rrelu(h)))
        return self.fc(self.prelu3(self.fc2(h)))


def prelu_net(**kwargs):
    return PReLUNet(**kwargs)


class ShrinkNet(torch.nn.Module):
    """Shrinks and thresholds (psd-export's path: PyTorch 1.13 exports hardshrink and softshrink as Where
    subgraphs, softsign as a Div of computed values, and refuses threshold != 0): Softsign, Hardshrink,
    Softshrink, Threshold, CELU at alpha 1, F.softsign, F.hardshrink, nn.PReLU; (3, 16, 16) images."""

    def __init__(self, num_classes=10):
        super().__init__()
        nn = torch.nn
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.hs = nn.Hardshrink(0.2)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.sg = nn.Softsign()
        self.th = nn.Threshold(0.05, -0.3)
        self.fc1 = nn.Linear(16, 32)
        self.ss = nn.Softshrink(0.1)
        self.prelu = nn.PReLU()
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x):
        F = torch.nn.functional
        x = self.hs(self.conv1(x))
        x = self.th(self.sg(self.conv2(x)))
        x = F.adaptive_avg_pool2d(F.celu(x), 1).flatten(1)
        h = self.ss(self.fc1(x) * 3.0)
        h = F.softsign(F.hardshrink(self.prelu(h), 0.05))
        return self.fc(h)


def shrink_net(**kwargs):
    return ShrinkNet(**kwargs)


class NormNet(torch.nn.Module):
    """Group and instance normalisation as U-Nets and style transfer use them: nn.GroupNorm (affine, over
    blocked convolutions' channels), nn.InstanceNorm2d with affine, F.group_norm and F.instance_norm without,
    F.normalize over the channels;
    (3, 16, 16) images."""

    def __init__(self, num_classes=10):
        super().__init__()
        nn = torch.nn
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.gn1 = nn.GroupNorm(4, 16)
        self.conv2 = nn.Conv2d(16, 16, 3, stride=2, padding=1)
        self.in2 = nn.InstanceNorm2d(16, affine=True)
        self.conv3 = nn.Conv2d(16, 8, 3, padding=1)
        self.pool = nn.AdaptiveMaxPool2d((2, 2))
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):
        F = torch.nn.functional
        x = F.silu(self.gn1(self.conv1(x)))
        x = torch.relu(self.in2(self.conv2(x)))
        x = F.group_norm(self.conv3(x), 2)
        x = F.instance_norm(x + 0.25) * 0.5 + F.normalize(x, dim=1)
        # 8x8: the mean as a sum (ReduceSum in ONNX), and the max of 2x2 adaptive maxima (ReduceMax in ONNX)
        return self.fc(x.sum(dim=(2, 3)) / 64.0 + self.pool(x).amax(dim=(2, 3)))


def norm_net(**kwargs):
    return NormNet(**kwargs)


class BcastNet(torch.nn.Module):
    """Numpy broadcasting between computed tensors as users write it: centring over the channels and over the
    features (x - x.mean(dim, keepdim=True)), a standardisation by hand ((x - mu) / (var + eps).sqrt() over the
    plane, a (N, C, 1, 1) by (N, C, H, W) both ways), a (N, C, 1, 1) sigmoid gate added, a (N, 1, H, W) mask
    multiplied, F.cosine_similarity of two branches over the channels, x.std and torch.std, x.var with
    correction, a norm over the plane (keepdim=False), a cosine head (x / x.norm(dim=1, keepdim=True),
    torch.linalg.vector_norm, torch.linalg.norm, torch.norm) and torch.div of two tensors;
    (3, 16, 16) images."""

    def __init__(self, num_classes=10):
        super().__init__()
        nn = torch.nn
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.gate = nn.Conv2d(8, 8, 1)
        self.mask = nn.Conv2d(8, 1, 1)
        self.a = nn.Conv2d(8, 8, 1)
        self.b = nn.Conv2d(8, 8, 1)
        self.fc1 = nn.Linear(128, 32)
        self.fc2 = nn.Linear(32, 16)
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x):
        F = torch.nn.functional
        h = self.conv(x)
        h = h - h.mean(dim=1, keepdim=True)
        mu = h.mean(dim=(2, 3), keepdim=True)
        h = (h - mu) / (torch.var(h, dim=(2, 3), keepdim=True, unbiased=False) + 1e-5).sqrt()
        g = torch.sigmoid(self.gate(h.mean(dim=(2, 3), keepdim=True)))
        h = F.relu(h + g) * (1.0 + 0.1 * torch.tanh(h.norm(dim=(2, 3)))).unsqueeze(-1).unsqueeze(-1)
        h = h * torch.sigmoid(self.mask(h))
        h = h * F.cosine_similarity(self.a(h), self.b(h), dim=1).unsqueeze(1)
        f = F.max_pool2d(h, 4).flatten(1)
        f = f - f.mean(dim=1, keepdim=True)
        f = torch.tanh(self.fc1(f))
        f = (f - f.mean(1, keepdim=True)) / f.std(1, keepdim=True) + 0.1 * f / torch.std(f, dim=1, keepdim=True)
        f = f / f.norm(dim=1, keepdim=True) + f / torch.linalg.vector_norm(f, 2, dim=1, keepdim=True) + 0.1 * f
        f = torch.div(self.fc2(f), torch.norm(f, p=2, dim=1, keepdim=True) + torch.linalg.norm(f, dim=1, keepdim=True))
        f = f * (1.0 + f.var(1, keepdim=True, correction=0))
        return self.fc(f)


def bcast_net(**kwargs):
    return BcastNet(**kwargs)


class ZeroNormNet(torch.nn.Module):
    """x.norm of all-zero vectors (a ReLU of values far below 0) beside live ones, over the channels and over
    the plane: psd-export's norm (sum(x * F.normalize(x))) has PyTorch's gradient there, 0, where a Sqrt of
    the sum of squares would give NaN; (3, 16, 16) images."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, num_classes)

    def forward(self, x):
        F = torch.nn.functional
        h = self.conv(x)
        h = h + F.relu(h - 100.0).norm(dim=1, keepdim=True) + 0.1 * h.norm(dim=(2, 3), keepdim=True)
        return self.fc(h.mean(dim=(2, 3)))


def zero_norm_net(**kwargs):
    return ZeroNormNet(**kwargs)
