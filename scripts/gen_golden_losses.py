#!/usr/bin/python3
"""Write tests/golden/losses.safetensors: the losses of `ps-train fit`
(trainer/losses.h) computed by PyTorch, for tests/test_losses.c.

Regenerate (needs PyTorch; Debian's python3-torch 1.13 made the committed
file):

    /usr/bin/python3 scripts/gen_golden_losses.py [output path]

Each case is a model output `out` (float32), its targets, and PyTorch's
answers:
  <case>.out       F32 (n, c, inner...) the output
  <case>.target    I64 (n, inner...) class ids (nll, cross_entropy) or F32
                   shaped like out (mse, bce_with_logits)
  <case>.grad      F32 like out: d loss / d out from autograd in float32
  <case>.correct   I64 (1,) correct predictions (argmax over dim 1 == target;
                   for bce_with_logits (out > 0) == (target > 0.5), for bce
                   (out > 0.5) == (target > 0.5)); absent
                   for mse and vae_bce
vae_bce's cases (rows [recon, mu, logvar]) hold their targets per row in the
metadata "<case>.t", the target F32 (n, t).
Cases with "<case>.ignore" (metadata, an integer) pass it as ignore_index: the
mean is over the targets not ignored and accuracy counts only those; a case
whose targets are all ignored holds PyTorch's nan in "<case>.torch_loss" and
psd's answer (loss 0, a zero gradient: docs/fit.md) as its loss and grad.
Cases "*_last" are a sequence model's (N, T, V) logits against (N, T) ids
the way PyTorch users write it, loss_fn(logits.reshape(-1, V),
tgt.reshape(-1)): out is stored (N, T, V), its shape "N*T,V,1".
Metadata "<case>.loss_name" names the row of the table, "<case>.shape" is
"n,c,inner", "<case>.loss" the mean loss (repr of a float64) computed by
torch.nn.functional in float64 from the float32 output.
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_golden import write_safetensors  # noqa: E402  (struct + json only)

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden",
                           "losses.safetensors")

torch.manual_seed(18)
tensors, meta = {}, {"torch": torch.__version__}


def case(name, loss_name, out, target, ignore=None, last=False):
    n, c = out.shape[0], out.shape[1]
    inner = out[0, 0].numel()
    fn = {"nll": F.nll_loss, "cross_entropy": F.cross_entropy, "mse": F.mse_loss,
          "bce_with_logits": F.binary_cross_entropy_with_logits, "bce": F.binary_cross_entropy}[loss_name]
    if ignore is not None or last:
        return class_case(name, loss_name, fn, out, target, ignore, last)
    x = out.clone().requires_grad_(True)
    fn(x, target).backward()
    loss64 = fn(out.double(), target if target.dtype == torch.int64 else target.double())
    tensors[name + ".out"] = out.contiguous()
    tensors[name + ".target"] = target.contiguous()
    meta[name + ".loss"] = repr(float(loss64))
    tensors[name + ".grad"] = x.grad.contiguous()
    if loss_name in ("nll", "cross_entropy"):
        tensors[name + ".correct"] = (out.argmax(1) == target).sum().reshape(1)
    elif loss_name == "bce_with_logits":
        tensors[name + ".correct"] = ((out > 0) == (target > 0.5)).sum().reshape(1)
    elif loss_name == "bce":
        tensors[name + ".correct"] = ((out > 0.5) == (target > 0.5)).sum().reshape(1)
    meta[name + ".loss_name"] = loss_name
    meta[name + ".shape"] = "%d,%d,%d" % (n, c, inner)


logits = torch.randn(7, 10) * 3
logits[1, 4] = 60.0          # a confident row
logits[2] = -80.0            # all equal: the first maximum wins for accuracy
logits[3, 0] = -100.0
y = torch.randint(0, 10, (7,))
case("nll_plain", "nll", F.log_softmax(logits, 1), y)
case("ce_plain", "cross_entropy", logits, y)
seg = torch.randn(3, 4, 2, 5) * 2      # (n, c, H, W): inner 10
yseg = torch.randint(0, 4, (3, 2, 5))
case("nll_inner", "nll", F.log_softmax(seg, 1), yseg)
case("ce_inner", "cross_entropy", seg, yseg)
big = torch.randn(32, 300)             # a wide classifier, the vectorised path
case("ce_wide", "cross_entropy", big, torch.randint(0, 300, (32,)))
case("mse_2d", "mse", torch.randn(5, 3), torch.randn(5, 3))
case("mse_img", "mse", torch.randn(2, 1, 4, 4), torch.rand(2, 1, 4, 4))
bl = torch.randn(9, 1) * 4
bl[0, 0], bl[1, 0], bl[2, 0] = 40.0, -40.0, 0.0
case("bce_binary", "bce_with_logits", bl, torch.randint(0, 2, (9, 1)).float())
case("bce_soft", "bce_with_logits", torch.randn(4, 3) * 2, torch.rand(4, 3))


def class_case(name, loss_name, fn, out, target, ignore, last):
    """A class loss with ignore_index and/or the classes last ((N, T, V), flattened as users do)."""
    kw = {} if ignore is None else {"ignore_index": ignore}
    V = out.shape[-1] if last else out.shape[1]
    flat = (lambda o: o.reshape(-1, V)) if last else (lambda o: o)
    tflat = target.reshape(-1) if last else target
    x = out.clone().requires_grad_(True)
    loss = fn(flat(x), tflat, **kw)
    loss.backward()
    loss64 = float(fn(flat(out.double()), tflat, **kw))
    keep = tflat != (ignore if ignore is not None else -(2 ** 62))
    grad = x.grad
    if not keep.any():                       # PyTorch: 0/0; psd: 0 and no gradient
        assert loss64 != loss64, "PyTorch no longer gives nan for an all-ignored batch"
        meta[name + ".torch_loss"] = repr(loss64)
        loss64, grad = 0.0, torch.zeros_like(out)
    tensors[name + ".out"] = out.contiguous()
    tensors[name + ".target"] = target.contiguous()
    tensors[name + ".grad"] = grad.contiguous()
    meta[name + ".loss"] = repr(loss64)
    pred = flat(out).argmax(1)
    tensors[name + ".correct"] = ((pred == tflat) & keep).sum().reshape(1)
    meta[name + ".loss_name"] = loss_name
    if ignore is not None:
        meta[name + ".ignore"] = str(ignore)
    if last:
        meta[name + ".shape"] = "%d,%d,%d" % (tflat.numel(), V, 1)
    else:
        meta[name + ".shape"] = "%d,%d,%d" % (out.shape[0], V, out[0, 0].numel())


probs = torch.sigmoid(torch.randn(6, 4) * 3)
probs[0, 0], probs[1, 1] = 0.0, 1.0      # PyTorch clamps each log at -100
case("bcep_mixed", "bce", probs, torch.rand(6, 4))
case("bcep_binary", "bce", torch.sigmoid(torch.randn(9, 1) * 2), torch.randint(0, 2, (9, 1)).float())


def vae_loss(out, target, t):
    """PyTorch's examples/vae loss_function on rows [recon (t), mu (L), logvar (L)], per sample (the sum / n)."""
    L = (out.shape[1] - t) // 2
    recon, mu, logvar = out[:, :t], out[:, t:t + L], out[:, t + L:]
    bce = F.binary_cross_entropy(recon, target, reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return (bce + kld) / out.shape[0]


def vae_case(name, n, t, L):
    """vae_bce: <case>.t (metadata) the targets per row; <case>.target F32 (n, t)."""
    out = torch.cat([torch.sigmoid(torch.randn(n, t) * 3), torch.randn(n, L), torch.randn(n, L) * 2], 1)
    out[0, 0] = 1e-30                      # a recon at 0 and at 1: PyTorch's log clamped at -100
    out[1, 1] = 1.0
    target = torch.rand(n, t)
    target[2] = (target[2] > 0.5).float()   # binary pixels too
    x = out.clone().requires_grad_(True)
    vae_loss(x, target, t).backward()
    tensors[name + ".out"] = out.contiguous()
    tensors[name + ".target"] = target.contiguous()
    tensors[name + ".grad"] = x.grad.contiguous()
    meta[name + ".loss"] = repr(float(vae_loss(out.double(), target.double(), t)))
    meta[name + ".loss_name"] = "vae_bce"
    meta[name + ".shape"] = "%d,%d,%d" % (n, t + 2 * L, 1)
    meta[name + ".t"] = str(t)


vae_case("vae_small", 5, 12, 3)
vae_case("vae_mnist", 4, 784, 20)
# ignore_index: an id in range (3 of 10), the segmentation habit 255 (out of range), a padded LM batch
yi = y.clone()
yi[0], yi[4] = 3, 3
case("ce_ignore", "cross_entropy", logits, yi, ignore=3)
case("nll_ignore", "nll", F.log_softmax(logits, 1), yi, ignore=3)
ysegi = yseg.clone()
ysegi[0, 0, :3] = 255
ysegi[2, 1, 4] = 255
case("ce_ignore_inner", "cross_entropy", seg, ysegi, ignore=255)
case("nll_ignore_inner", "nll", F.log_softmax(seg, 1), ysegi, ignore=255)
lm = torch.randn(3, 6, 11) * 2               # (N, T, V) logits; targets padded with 0 at the end
ylm = torch.randint(1, 11, (3, 6))
ylm[0, 4:] = 0
ylm[2, 1:] = 0
case("ce_pad_last", "cross_entropy", lm, ylm, ignore=0, last=True)
case("nll_pad_last", "nll", F.log_softmax(lm, 2), ylm, ignore=0, last=True)
case("ce_last", "cross_entropy", lm, ylm, last=True)      # the classes last, nothing ignored
case("ce_all_ignored", "cross_entropy", lm[:2], torch.zeros(2, 6, dtype=torch.int64), ignore=0, last=True)
case("nll_all_ignored", "nll", F.log_softmax(logits, 1), torch.full((7,), 3, dtype=torch.int64), ignore=3)

write_safetensors(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUT, tensors, meta)
