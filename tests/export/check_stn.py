#!/usr/bin/python3
"""tests/it_stn.sh's Python half: the Spatial Transformer Networks tutorial (tests/export/stn.py) through psd-export
and psd, against PyTorch, on MNIST digits (data/mnist, or $DATA):

  Net            the tutorial's model (F.affine_grid(theta, x.size()), F.grid_sample(x, grid)), dropout p 0
  StnBorder      padding_mode border, align_corners True
  StnReflection  padding_mode reflection
  StnNearest     mode nearest (no gradient reaches theta)

Each exported with psd-export (AffineGrid and GridSample nodes), every parameter moved off its initial value (the
identity theta's zero weights too, so the warp is not the identity and every gradient shows), psd started with
--init-from those values and checked by check_rnn.checked: the input gradient (through the sampled pixels and
through the localisation net's grid) within 1e-4 of PyTorch's, check_resnet's run() with float64 autograd (the
forwards, every parameter gradient within 8x PyTorch float32's own error or 1e-4 of the tensor's largest, the
step, a strict load_state_dict). Then Net trained through psd from the tutorial's initialisation (theta the
identity) for 150 SGD steps of 32 digits each (lr 0.01, NLL loss as the tutorial, the next digits each step) beside
PyTorch's own loop from the same weights on the same batches: the losses within 1e-5 (relative) of PyTorch's for the
steps before PyTorch's float32 loop drifts 1e-5 from its float64 one (at least 3, at most 30), psd's largest distance
from the float64 loop within 3x the largest of three PyTorch float32 loops' (its own and two from weights nudged
by one part in 2^23: 0.0056-0.0099 on one AVX-512 host as oneDNN's ISA varied, psd's 0.0121-0.0122) - at the
identity theta the grid points sit on pixel centres, where grid_sample's gradient is one-sided, so float32 rounding
picks a side and two float32 runs drift apart after a while, as PyTorch's float32 and float64 runs do from the first
steps, by how much depending on the CPU's kernels (AVX-512: 3e-4 by step 10) - and the loss falling below 0.8 of its
start. GridNet (a grid computed per point by a 1x1 convolution,
border padding) exported to ONNX at opset 16 (GridSample) through psd's ONNX import, checked the same way. And
psd-export's refusals
of a 3-d affine grid and bicubic sampling, and psd --check-config's of model files whose AffineGrid or GridSample
does not fit (a (3, 4) theta, a grid of 3 values a point, mode bicubic, padding_mode circular).

    check_stn.py BUILD_DIR TMP_DIR
"""
import copy
import json
import os
import random
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_resnet as cr  # noqa: E402 (reads BUILD_DIR TMP_DIR from sys.argv, as this script takes them)
import check_rnn  # noqa: E402
import stn  # noqa: E402
from psd._proto import ps_pb2  # noqa: E402  (check_resnet put python/ on the path)

DATA = os.environ.get("DATA", os.path.join(cr.ROOT, "data", "mnist"))
CASES = [("Net", stn.Net), ("StnBorder", stn.StnBorder), ("StnReflection", stn.StnReflection),
         ("StnNearest", stn.StnNearest)]
BATCH, STEPS, EXACT = 32, 150, 30


def mnist(n, offset=0):
    """n digits from the MNIST training set (offset on), normalised as the tutorial's transform, plus N(0, 1e-3^2)
    noise, and labels. The noise: a digit's background is one value, so the localisation net's max pools see
    windows of equal (or last-bit apart) convolution outputs, where which element takes the gradient follows
    each backend's rounding (the input gradient is 4% off PyTorch's without it); noise far below a grey level
    keeps them apart."""
    with open(os.path.join(DATA, "train-images-idx3-ubyte"), "rb") as f:
        f.seek(16 + offset * 784)
        x = np.frombuffer(f.read(n * 784), dtype=np.uint8).reshape(n, 1, 28, 28)
    with open(os.path.join(DATA, "train-labels-idx1-ubyte"), "rb") as f:
        f.seek(8 + offset)
        y = np.frombuffer(f.read(n), dtype=np.uint8)
    x = (torch.from_numpy(x.astype(np.float32)) / 255.0 - 0.1307) / 0.3081
    x += 1e-3 * torch.randn(x.shape, generator=torch.Generator().manual_seed(offset))
    return x, torch.from_numpy(y.astype(np.int64))


def export(pe, cls, name, kwargs=None):
    y = os.path.join(cr.TMP, name + ".yaml")
    rc = pe.main([os.path.join(HERE, "stn.py") + ":" + cls.__name__, "--seed", "3", "-o", y,
                  "--input-shape", "1,28,28"] + (["--kwargs", json.dumps(kwargs)] if kwargs else []))
    return rc, y


def train(pe, label, cls, y):
    """STEPS SGD steps through psd (model file y) from cls's initialisation (seed 3: the tutorial's, theta the
    identity), each on the next BATCH digits, beside PyTorch's own loop from the same weights."""
    torch.manual_seed(3)
    model = cls(p=0.0).train()   # never trained: each loop below trains a copy
    w = os.path.join(cr.TMP, "stn_train_init.safetensors")
    pe.write_safetensors(w, list(model.state_dict().items()), {})
    stub, p = cr.start_psd("stn_train", "file: %s" % y, ["--init-from", w])
    batches = [mnist(BATCH, 1000 + s * BATCH) for s in range(STEPS)]
    losses = []
    for x, target in batches:
        ctx = random.randint(1, 1 << 60)
        r = stub.Forward(ps_pb2.ForwardRequest(context_id=ctx, seq=0, train=True, trainer_rank=1,
                                               input=cr.tensor(x.numpy())), timeout=60)
        y = torch.from_numpy(cr.array(r.output).copy().reshape(BATCH, 10)).requires_grad_(True)
        loss = F.nll_loss(y, target)
        gy = torch.autograd.grad(loss, y)[0]
        stub.Backward(ps_pb2.BackwardRequest(context_id=ctx, seq=0, grad_output=cr.tensor(gy.numpy())), timeout=60)
        stub.Step(ps_pb2.StepRequest(context_id=ctx), timeout=60)
        losses.append(float(loss))
    p.kill()

    def torch_losses(m, dtype=torch.float32):   # PyTorch's own loop on the same batches
        opt = torch.optim.SGD(m.parameters(), lr=cr.LR)
        out = []
        for x, target in batches:
            opt.zero_grad()
            lt = F.nll_loss(m(x.to(dtype)), target)
            lt.backward()
            opt.step()
            out.append(float(lt))
        return out

    want, want64 = torch_losses(copy.deepcopy(model)), torch_losses(copy.deepcopy(model).double(), torch.float64)
    # two more float32 loops from the same weights nudged by one part in 2^23 (each weight's last bit or so): how far
    # float32 runs of this loop drift from its float64 one on this machine
    spread = [want]
    for k in (1, 2):
        mk = copy.deepcopy(model)
        g = torch.Generator().manual_seed(k)
        with torch.no_grad():
            for t in mk.parameters():
                t.mul_(1 + 2.0 ** -23 * torch.randn(t.shape, generator=g))
        spread.append(torch_losses(mk))
    rel = [abs(a - b) / abs(b) for a, b in zip(losses, want)]
    dist = lambda run: max(abs(a - b) / abs(b) for a, b in zip(run, want64))  # noqa: E731
    own = [abs(a - b) / abs(b) for a, b in zip(want, want64)]
    exact = next((s for s in range(EXACT) if own[s] > 1e-5), EXACT)
    exact = max(exact, 3)
    cr.check(max(rel[:exact]) <= 1e-5, "%s: the first %d of %d SGD steps on %d MNIST digits each through psd (those "
             "before PyTorch float32's loss drifts 1e-5 from float64's, at least 3, at most %d): each step's loss "
             "within 1e-5 of PyTorch's loop's (worst %.3g)"
             % (label, exact, STEPS, BATCH, EXACT, max(rel[:exact])))
    allowed = 3 * max(dist(r) for r in spread)
    cr.check(dist(losses) <= allowed, "%s: all %d steps: psd's losses as far from PyTorch's float64 loop as at most "
             "3x PyTorch's float32 loops' (the loop's and two from weights nudged in the last bit; worst %.3g, "
             "allowed %.3g; psd %.4f -> %.4f, PyTorch %.4f -> %.4f)"
             % (label, STEPS, dist(losses), allowed, losses[0], losses[-1], want[0], want[-1]))
    first, last = np.mean(losses[:5]), np.mean(losses[-5:])
    cr.check(last < 0.8 * first, "%s: the loss falls (mean of the first 5 steps %.4f, of the last 5 %.4f)"
             % (label, first, last))


def main():
    if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte")):
        cr.check(False, "MNIST digits at %s (scripts/fetch-mnist.sh, or DATA=...)" % DATA)
        return
    pe = cr.load_psd_export()
    for i, (label, cls) in enumerate(CASES):
        name = "stn_%d" % i
        rc, y = export(pe, cls, name, {"p": 0.0})
        text = open(y).read() if rc == 0 else ""
        cr.check(rc == 0 and "kind: AffineGrid" in text and "kind: GridSample, inputs: [input, affine_grid]" in text,
                 "psd-export of %s: AffineGrid and GridSample nodes" % label)
        if rc:
            continue
        model, w = cr.moved(lambda: cls(p=0.0), name, seed=3)
        x, target = mnist(8, 100 * i)
        check_rnn.checked(label, name, y, w, model, x, target, input_grad=True, steps=0)
        if cls is stn.Net:
            train(pe, label, cls, y)
    onnx_grid()
    refused_files()
    cr.refused(lambda cls, name: export(pe, cls, name), (
        (stn.AffineGrid3d, "the 2-d one (size (N, C, H, W), theta (N, 2, 3))"),
        (stn.GridBicubic, "mode 'bicubic'")))


def onnx_grid():
    """GridNet's training-mode ONNX export at opset 16 (GridSample of a grid computed from the input; PyTorch 1.13
    does not export F.affine_grid) through psd's ONNX import, checked by check_resnet's run() with float64
    autograd."""
    model, _ = cr.moved(stn.GridNet, "gridnet_onnx", seed=3)
    x, target = mnist(8, 900)
    path = os.path.join(cr.TMP, "gridnet.onnx")
    torch.onnx.export(copy.deepcopy(model).train(), x, path, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, opset_version=16)
    stub, p = cr.start_psd("gridnet_onnx", "onnx: %s" % path, [])
    cr.input_gradient("GridNet (ONNX)", stub, model, x, target)
    cr.run("GridNet (ONNX)", stub, copy.deepcopy(model), x, target, ref64=True)
    p.kill()


def refused_files():
    """psd --check-config refuses model files whose AffineGrid or GridSample does not fit, naming what."""
    for what, nodes, want in (
            ("AffineGrid of a (3, 4) theta", "{name: g, kind: AffineGrid, size: [4, 4]}",
             "AffineGrid takes theta (2, 3)"),
            ("GridSample of a grid of 3 values a point", "{name: g, kind: GridSample, inputs: [input, input]}",
             "GridSample takes the input (C, H, W) and a grid (H', W', 2)"),
            ("GridSample in mode bicubic", "{name: p, kind: Permute, dims: [0, 2, 3, 1]}\n"
             "      - {name: n, kind: Narrow, dim: 3, start: 0, length: 2}\n"
             "      - {name: g, kind: GridSample, inputs: [input, n], mode: bicubic}", "mode 'bicubic'"),
            ("GridSample with padding_mode circular", "{name: g, kind: GridSample, inputs: [input, input], "
             "padding_mode: circular}", "padding_mode")):
        cr.refused_file(what, "[3, 4]" if "theta" in what else "[3, 4, 4]", nodes, want)


if __name__ == "__main__":
    cr.run_main(main)
