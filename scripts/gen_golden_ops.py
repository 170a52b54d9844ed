#!/usr/bin/python3
"""Write tests/golden/nn_ops.safetensors: PyTorch's forward and autograd
backward of every backend op issue 18 added (common/nn/backend.h), over the
attribute combinations the layer kinds expose - the reference for
tests/test_nn_ops.c on the ref, dnnl and cuda backends.

    /usr/bin/python3 scripts/gen_golden_ops.py [output directory]

Each case is a name; the metadata entry "cases" lists them in order and the
entry "<case>" describes one as "kind=K key=value ..." (kinds: conv,
maxpool, avgpool, bn, ln, act, softmax, dropout2d, concat, add, adaptive:
adaptive average pooling to oh x ow, PyTorch's uneven bins). Its tensors
are "<case>.<name>", float32, row-major:
  inputs       x (and a, b for add/concat parts), w, b, gamma, beta,
               running_mean, running_var (BatchNorm's before the step),
               mask (dropout2d, per (sample, channel))
  gy           the output gradient fed backward: the loss is sum(y * gy)
  outputs      y; save_mean, save_invstd (BatchNorm training: biased batch
               statistics) and running_mean_new, running_var_new (after
               PyTorch's momentum update, momentum in the description)
  gradients    gx (ga, gb for the parts), gw, gb, ggamma, gbeta
Shapes are small and odd (non-square, channel counts that are not powers of
two), plus a few with 16 channels so that the blocked layouts of the dnnl
backend are exercised too. Everything is float32 as PyTorch computes it on
the CPU; seeds are fixed, so the file is reproducible. It is read back and
compared with what was computed.
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_golden import read_safetensors, write_safetensors  # noqa: E402

SEED = 18


def desc(kind, **kv):
    return " ".join([f"kind={kind}"] + [f"{k}={v}" for k, v in kv.items()])


class Cases:
    def __init__(self):
        self.tensors = {}
        self.meta = {}
        self.names = []

    def add(self, name, description, **tensors):
        assert name not in self.meta and "," not in name and "." not in name, name
        self.names.append(name)
        self.meta[name] = description
        for k, v in tensors.items():
            if v is None:
                continue
            self.tensors[f"{name}.{k}"] = v.detach().float().contiguous().clone()


def rand(*shape, scale=1.0):
    return (torch.randn(*shape) * scale).requires_grad_(True)


def grad_of(t):
    return None if t is None or t.grad is None else t.grad


# ---- convolution ----------------------------------------------------------

CONV = [
    # name, n, cin, h, w, cout, (kh, kw), (sh, sw), (ph, pw), (dh, dw), groups, bias
    ("conv_basic", 2, 3, 8, 7, 4, (3, 3), (1, 1), (0, 0), (1, 1), 1, True),
    ("conv_s2_p1", 2, 3, 9, 8, 5, (3, 3), (2, 2), (1, 1), (1, 1), 1, True),
    ("conv_rect_nobias", 2, 4, 9, 7, 6, (3, 2), (2, 1), (1, 0), (1, 1), 1, False),
    ("conv_dil2", 2, 4, 10, 9, 5, (3, 3), (1, 1), (2, 2), (2, 2), 1, True),
    ("conv_dil_rect", 2, 3, 9, 10, 4, (3, 3), (1, 2), (1, 2), (2, 1), 1, True),
    ("conv_g2", 2, 4, 7, 6, 6, (3, 3), (1, 1), (1, 1), (1, 1), 2, True),
    ("conv_g3_dil_s2", 2, 6, 11, 9, 3, (3, 2), (2, 2), (2, 1), (2, 2), 3, False),
    ("conv_dw", 2, 4, 7, 8, 4, (3, 3), (1, 1), (1, 1), (1, 1), 4, True),
    ("conv_dw_mult_s2", 2, 4, 9, 9, 8, (3, 3), (2, 2), (1, 1), (1, 1), 4, False),
    ("conv_1x1_s2", 2, 5, 7, 6, 3, (1, 1), (2, 2), (0, 0), (1, 1), 1, True),
    ("conv_5x1_p2x0", 2, 2, 8, 5, 3, (5, 1), (1, 1), (2, 0), (1, 1), 1, True),
    # 16 channels: blocked layouts on the dnnl backend
    ("conv_c16_g2", 2, 16, 6, 5, 16, (3, 3), (1, 1), (1, 1), (1, 1), 2, True),
    ("conv_c16_dw_dil2", 2, 16, 7, 6, 16, (3, 3), (1, 1), (2, 2), (2, 2), 16, True),
    ("conv_c16_dil2_s2", 2, 16, 9, 8, 16, (3, 3), (2, 2), (1, 1), (2, 2), 1, False),
]


def conv_cases(c):
    for name, n, cin, h, w, cout, k, s, p, d, g, bias in CONV:
        conv = nn.Conv2d(cin, cout, k, stride=s, padding=p, dilation=d, groups=g, bias=bias)
        x = rand(n, cin, h, w)
        y = conv(x)
        gy = torch.randn_like(y)
        y.backward(gy)
        c.add(name, desc("conv", n=n, cin=cin, h=h, w=w, cout=cout, kh=k[0], kw=k[1], sh=s[0], sw=s[1],
                         ph=p[0], pw=p[1], dh=d[0], dw=d[1], groups=g, bias=int(bias)),
              x=x, w=conv.weight, b=conv.bias, y=y, gy=gy, gx=x.grad, gw=conv.weight.grad,
              gb=grad_of(conv.bias))


# ---- pooling --------------------------------------------------------------

POOL = [
    # name, kind, n, c, h, w, (kh, kw), (sh, sw), (ph, pw), count_include_pad, ties
    ("max_k2s2", "maxpool", 2, 3, 8, 7, (2, 2), (2, 2), (0, 0), 1, False),
    ("max_k3s2p1", "maxpool", 2, 3, 9, 8, (3, 3), (2, 2), (1, 1), 1, False),
    ("max_rect_p", "maxpool", 2, 3, 9, 7, (3, 2), (1, 2), (1, 1), 1, False),
    ("max_k3s1p1_ties", "maxpool", 2, 2, 6, 7, (3, 3), (1, 1), (1, 1), 1, True),
    ("max_k3s2_overlap", "maxpool", 2, 3, 11, 10, (3, 3), (2, 2), (0, 0), 1, False),
    ("avg_k2s2", "avgpool", 2, 3, 8, 7, (2, 2), (2, 2), (0, 0), 1, False),
    ("avg_k3s2p1_inc", "avgpool", 2, 3, 9, 8, (3, 3), (2, 2), (1, 1), 1, False),
    ("avg_k3s2p1_exc", "avgpool", 2, 3, 9, 8, (3, 3), (2, 2), (1, 1), 0, False),
    ("avg_rect_inc", "avgpool", 2, 3, 8, 9, (3, 2), (2, 1), (1, 1), 1, False),
    ("avg_rect_exc", "avgpool", 2, 3, 8, 9, (3, 2), (2, 1), (1, 1), 0, False),
    ("gap_5x7", "avgpool", 2, 3, 5, 7, (5, 7), (1, 1), (0, 0), 1, False),
    ("max_c16_k3s2p1", "maxpool", 2, 16, 7, 6, (3, 3), (2, 2), (1, 1), 1, False),
    ("avg_c16_k3s2p1_exc", "avgpool", 2, 16, 7, 6, (3, 3), (2, 2), (1, 1), 0, False),
    ("gap_c16_4x3", "avgpool", 2, 16, 4, 3, (4, 3), (1, 1), (0, 0), 1, False),
]


def pool_cases(c):
    for name, kind, n, ch, h, w, k, s, p, cip, ties in POOL:
        if ties:
            x = torch.randint(0, 3, (n, ch, h, w)).float().requires_grad_(True)
        else:
            x = rand(n, ch, h, w)
        if name.startswith("gap"):
            y = F.adaptive_avg_pool2d(x, 1)   # what AdaptiveAvgPool2d((1, 1)) is
            assert k == (h, w)
        elif kind == "maxpool":
            y = F.max_pool2d(x, k, s, p)
        else:
            y = F.avg_pool2d(x, k, s, p, count_include_pad=bool(cip))
        gy = torch.randn_like(y)
        y.backward(gy)
        c.add(name, desc(kind, n=n, c=ch, h=h, w=w, kh=k[0], kw=k[1], sh=s[0], sw=s[1], ph=p[0], pw=p[1],
                         count_include_pad=cip),
              x=x, y=y, gy=gy, gx=x.grad)


# ---- batch normalisation --------------------------------------------------

BN = [
    # name, input shape, training, affine, eps, momentum
    ("bn2d_train_affine", (4, 3, 5, 4), True, True, 1e-5, 0.1),
    ("bn2d_train_noaffine", (3, 5, 3, 4), True, False, 1e-5, 0.1),
    ("bn2d_train_eps_mom", (2, 3, 4, 5), True, True, 1e-3, 0.3),
    ("bn2d_eval_affine", (4, 3, 5, 4), False, True, 1e-5, 0.1),
    ("bn2d_eval_noaffine", (2, 4, 3, 3), False, False, 1e-5, 0.1),
    ("bn1d_train_nc", (6, 5), True, True, 1e-5, 0.1),
    ("bn1d_train_ncl", (3, 4, 5), True, True, 1e-5, 0.1),
    ("bn1d_train_nc_noaffine", (5, 7), True, False, 1e-5, 0.1),
    ("bn1d_eval_nc", (6, 5), False, True, 1e-5, 0.1),
    ("bn1d_eval_ncl", (3, 4, 5), False, True, 1e-5, 0.1),
    ("bn2d_c16_train_affine", (2, 16, 4, 3), True, True, 1e-5, 0.1),
    ("bn2d_c16_eval_affine", (2, 16, 4, 3), False, True, 1e-5, 0.1),
]


def bn_cases(c):
    for name, shape, training, affine, eps, mom in BN:
        ch = shape[1]
        bn = (nn.BatchNorm2d if len(shape) == 4 else nn.BatchNorm1d)(ch, eps=eps, momentum=mom, affine=affine)
        with torch.no_grad():
            if affine:   # not the initial 1 and 0: a dropped gamma or beta must show
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.uniform_(-0.5, 0.5)
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
        rm0, rv0 = bn.running_mean.clone(), bn.running_var.clone()
        bn.train(training)
        x = (torch.randn(*shape) * 1.5 + 0.3).requires_grad_(True)
        y = bn(x)
        gy = torch.randn_like(y)
        y.backward(gy)
        dims = [0] + list(range(2, len(shape)))
        xd = x.detach()
        mean = xd.mean(dims)
        invstd = 1.0 / torch.sqrt(xd.var(dims, unbiased=False) + eps)
        s = 1
        for d in shape[2:]:
            s *= d
        c.add(name, desc("bn", n=shape[0], c=ch, s=s, ndim=len(shape), training=int(training), affine=int(affine),
                         eps=repr(eps), momentum=repr(mom)),
              x=x, gamma=bn.weight if affine else None, beta=bn.bias if affine else None,
              running_mean=rm0, running_var=rv0, y=y, gy=gy, gx=x.grad,
              ggamma=grad_of(bn.weight) if affine else None, gbeta=grad_of(bn.bias) if affine else None,
              save_mean=mean if training else None, save_invstd=invstd if training else None,
              running_mean_new=bn.running_mean, running_var_new=bn.running_var)


# ---- layer normalisation --------------------------------------------------

LN = [
    # name, input shape, normalized_shape, affine, eps
    ("ln_last", (3, 4, 6), (6,), True, 1e-5),
    ("ln_two_dims", (2, 3, 4, 5), (4, 5), True, 1e-5),
    ("ln_noaffine", (4, 10), (10,), False, 1e-5),
    ("ln_eps", (5, 7), (7,), True, 1e-3),
]


def ln_cases(c):
    for name, shape, ns, affine, eps in LN:
        ln = nn.LayerNorm(ns, eps=eps, elementwise_affine=affine)
        if affine:
            with torch.no_grad():
                ln.weight.uniform_(0.5, 1.5)
                ln.bias.uniform_(-0.5, 0.5)
        x = (torch.randn(*shape) * 2.0 - 0.4).requires_grad_(True)
        y = ln(x)
        gy = torch.randn_like(y)
        y.backward(gy)
        cols = 1
        for d in ns:
            cols *= d
        rows = x.numel() // cols
        c.add(name, desc("ln", rows=rows, cols=cols, affine=int(affine), eps=repr(eps)),
              x=x, gamma=ln.weight if affine else None, beta=ln.bias if affine else None,
              y=y, gy=gy, gx=x.grad, ggamma=grad_of(ln.weight) if affine else None,
              gbeta=grad_of(ln.bias) if affine else None)


# ---- activations ----------------------------------------------------------

ACT = [
    # name, act (the C test's ps_act_kind name), module, alpha
    ("act_relu", "relu", nn.ReLU(), 0.0),
    ("act_leaky_001", "leaky_relu", nn.LeakyReLU(0.01), 0.01),
    ("act_leaky_02", "leaky_relu", nn.LeakyReLU(0.2), 0.2),
    ("act_gelu", "gelu", nn.GELU(), 0.0),
    ("act_gelu_tanh", "gelu_tanh", nn.GELU(approximate="tanh"), 0.0),
    ("act_silu", "silu", nn.SiLU(), 0.0),
    ("act_tanh", "tanh", nn.Tanh(), 0.0),
    ("act_sigmoid", "sigmoid", nn.Sigmoid(), 0.0),
]


def act_cases(c):
    for name, act, mod, alpha in ACT:
        x = rand(2, 3, 4, 5, scale=3.0)   # both signs, and tails where tanh/sigmoid saturate
        y = mod(x)
        gy = torch.randn_like(y)
        y.backward(gy)
        c.add(name, desc("act", act=act, alpha=repr(alpha), count=x.numel()), x=x, y=y, gy=gy, gx=x.grad)


# The hard activations (mobilenet_v2/v3), added later: their own seed (main) so the cases above keep their
# values. Inputs at scale 4 cross every kink (+-3, min_val, max_val, 0 and 6).
HARD_ACT = [
    # name, act, module, alpha (Hardtanh's min_val), beta (max_val)
    ("act_hardtanh", "hardtanh", nn.Hardtanh(-1.0, 1.0), -1.0, 1.0),
    ("act_hardtanh_asym", "hardtanh", nn.Hardtanh(-0.5, 2.5), -0.5, 2.5),
    ("act_relu6", "hardtanh", nn.ReLU6(), 0.0, 6.0),
    ("act_hardswish", "hardswish", nn.Hardswish(), 0.0, 0.0),
    ("act_hardsigmoid", "hardsigmoid", nn.Hardsigmoid(), 0.0, 0.0),
]


def hard_act_cases(c):
    for name, act, mod, alpha, beta in HARD_ACT:
        x = rand(2, 3, 4, 5, scale=4.0)
        y = mod(x)
        gy = torch.randn_like(y)
        y.backward(gy)
        c.add(name, desc("act", act=act, alpha=repr(alpha), beta=repr(beta), count=x.numel()), x=x, y=y, gy=gy,
              gx=x.grad)


# Shrinks, thresholds and PReLU, added later: their own seed (main). Kinks (+-lambd, the threshold, 0) at
# multiples of 0.1: test_nn_ops' finite differences place every value 0.05 from them.
SHRINK_ACT = [
    # name, act, module, alpha, beta
    ("act_celu", "celu", nn.CELU(0.7), 0.7, 0.0),
    ("act_celu_1", "celu", nn.CELU(1.0), 1.0, 0.0),          # dnnl: oneDNN's elu
    ("act_softsign", "softsign", nn.Softsign(), 0.0, 0.0),
    ("act_tanhshrink", "tanhshrink", nn.Tanhshrink(), 0.0, 0.0),
    ("act_hardshrink", "hardshrink", nn.Hardshrink(0.5), 0.5, 0.0),
    ("act_softshrink", "softshrink", nn.Softshrink(0.3), 0.3, 0.0),
    ("act_threshold", "threshold", nn.Threshold(0.5, -2.0), 0.5, -2.0),
]
PRELU = [
    # name, shape, slopes (1: one for all, else one per channel of dim 1)
    ("prelu_one", (2, 3, 4, 5), 1),
    ("prelu_channels", (2, 3, 4, 5), 3),
    ("prelu_features", (4, 6), 6),
]


def shrink_act_cases(c):
    for name, act, mod, alpha, beta in SHRINK_ACT:
        x = rand(2, 3, 4, 5, scale=2.0)
        y = mod(x)
        gy = torch.randn_like(y)
        y.backward(gy)
        c.add(name, desc("act", act=act, alpha=repr(alpha), beta=repr(beta), count=x.numel()), x=x, y=y, gy=gy,
              gx=x.grad)
    for name, shape, k in PRELU:
        x = rand(*shape, scale=2.0)
        w = (torch.randn(k) * 0.5).requires_grad_(True)
        y = F.prelu(x, w)
        gy = torch.randn_like(y)
        y.backward(gy)
        c.add(name, desc("prelu", n=shape[0], c=k, s=x.numel() // (shape[0] * k)), x=x, w=w, y=y, gy=gy, gx=x.grad,
              gw=w.grad)


# ---- softmax over a dimension ---------------------------------------------

SOFTMAX = [
    # name, shape, dim, log
    ("softmax_dim1", (2, 5, 3, 4), 1, 0),
    ("log_softmax_dim1", (2, 5, 3, 4), 1, 1),
    ("softmax_dim2", (2, 3, 6, 4), 2, 0),
    ("log_softmax_last", (3, 4, 7), 2, 1),
    ("softmax_last", (3, 4, 7), 2, 0),      # inner 1: dnnl's row-wise backward, not oneDNN's ref:any
]


def softmax_cases(c):
    for name, shape, dim, log in SOFTMAX:
        x = rand(*shape, scale=2.0)
        y = F.log_softmax(x, dim) if log else F.softmax(x, dim)
        gy = torch.randn_like(y)
        y.backward(gy)
        outer = inner = 1
        for d in shape[:dim]:
            outer *= d
        for d in shape[dim + 1:]:
            inner *= d
        c.add(name, desc("softmax", outer=outer, dim=shape[dim], inner=inner, log=log), x=x, y=y, gy=gy, gx=x.grad)


# ---- dropout2d, concat, add -----------------------------------------------

def misc_cases(c):
    for name, shape, p in (("dropout2d_p03", (3, 4, 5, 3), 0.3), ("dropout2d_c16_p05", (2, 16, 3, 3), 0.5)):
        x = rand(*shape)
        y = F.dropout2d(x, p, training=True)
        gy = torch.randn_like(y)
        y.backward(gy)
        # The channel mask PyTorch drew: 0 or 1/(1-p), constant over each channel.
        ratio = (y.detach() / x.detach()).reshape(shape[0], shape[1], -1)
        mask = ratio[:, :, 0]
        assert torch.allclose(ratio, mask[:, :, None].expand_as(ratio), rtol=1e-5), "mask not per channel"
        c.add(name, desc("dropout2d", n=shape[0], c=shape[1], s=shape[2] * shape[3], p=repr(p)),
              x=x, mask=mask, y=y, gy=gy, gx=x.grad)
    for name, sa, sb, dim in (("concat_dim1", (2, 3, 4, 5), (2, 2, 4, 5), 1),
                              ("concat_last", (3, 4, 2), (3, 4, 5), 2),
                              ("concat_c16", (2, 16, 3, 2), (2, 16, 3, 2), 1)):
        a, b = rand(*sa), rand(*sb)
        y = torch.cat([a, b], dim)
        gy = torch.randn_like(y)
        y.backward(gy)
        rows = 1
        for d in sa[:dim]:
            rows *= d
        ca = a.numel() // rows
        cb = b.numel() // rows
        c.add(name, desc("concat", rows=rows, ca=ca, cb=cb, n=sa[0], c_a=sa[1], c_b=sb[1],
                         spatial=(a.numel() // (sa[0] * sa[1]))),
              a=a, b=b, y=y, gy=gy, ga=a.grad, gb=b.grad)
    a, b = rand(2, 3, 4, 5), rand(2, 3, 4, 5)
    y = a + b
    gy = torch.randn_like(y)
    y.backward(gy)
    c.add("add_residual", desc("add", count=a.numel()), a=a, b=b, y=y, gy=gy, ga=a.grad, gb=b.grad)


# ---- adaptive average pooling (AdaptiveAvgPool2d to any size) ---------------

ADAPTIVE = [
    # name, n, c, h, w, (oh, ow)
    ("adapt_7x5_to_3x2", 2, 3, 7, 5, (3, 2)),        # shrinking, uneven overlapping bins
    ("adapt_2x2_to_7x7", 2, 3, 2, 2, (7, 7)),        # vgg at 64x64: growing
    ("adapt_1x1_to_6x6", 2, 4, 1, 1, (6, 6)),        # alexnet at 64x64: every bin the one element
    ("adapt_13x13_to_6x6", 1, 3, 13, 13, (6, 6)),    # alexnet at 224x224
    ("adapt_5x9_to_5x4", 2, 2, 5, 9, (5, 4)),        # one side the identity
    ("adapt_6x4_to_3x2", 2, 3, 6, 4, (3, 2)),        # uniform bins (the kind runs these as avgpool)
]


def adaptive_cases(c):
    for name, n, ch, h, w, o in ADAPTIVE:
        x = rand(n, ch, h, w)
        y = F.adaptive_avg_pool2d(x, o)
        gy = torch.randn_like(y)
        y.backward(gy)
        c.add(name, desc("adaptive", n=n, c=ch, h=h, w=w, oh=o[0], ow=o[1]), x=x, y=y, gy=gy, gx=x.grad)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..', 'tests', 'golden')
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    c = Cases()
    conv_cases(c)
    pool_cases(c)
    bn_cases(c)
    ln_cases(c)
    act_cases(c)
    softmax_cases(c)
    misc_cases(c)
    torch.manual_seed(SEED + 1)
    hard_act_cases(c)
    torch.manual_seed(SEED + 2)
    adaptive_cases(c)
    torch.manual_seed(SEED + 3)
    shrink_act_cases(c)
    meta = dict(c.meta)
    meta.update({"generator": "scripts/gen_golden_ops.py", "torch": torch.__version__, "cases": ",".join(c.names)})
    path = os.path.join(out, 'nn_ops.safetensors')
    write_safetensors(path, c.tensors, meta)
    back, bmeta = read_safetensors(path)
    assert set(back) == set(c.tensors)
    for k, v in c.tensors.items():
        assert torch.equal(back[k], v), k
    assert bmeta == meta
    print(f"wrote {path}: {len(c.names)} cases, {len(c.tensors)} tensors, {os.path.getsize(path)} bytes")


if __name__ == '__main__':
    main()
