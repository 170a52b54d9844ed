#!/usr/bin/python3
"""tests/it_dist.sh's Python half: distances to parameters and torch.sign (tests/export/dist.py) through
psd-export and psd, against PyTorch:

  ProtoNet    -((h.unsqueeze(1) - self.c.unsqueeze(0)) ** 2).sum(-1): squared distances to learned prototypes (a
              Parameter node of the top module's c, a Sub broadcasting (1, 8) against (5, 8), Pow, the sum)
  ProtoViews  h[:, None] - self.protos.c[None], self.c2.view(1, 4, 8), h.unsqueeze(-1) - self.c3.t() (a Permute
              of the Parameter)
  Cdists      torch.cdist(h, self.c) (p 2), p 1, p inf of (N, 3, 8) rows against a parameter, and cdist(r, r) of
              a computed (N, 3, 8) against itself: zero distances, whose gradient PyTorch defines as 0
  Pairs       F.pairwise_distance (p 2; p 1 with keepdim), nn.PairwiseDistance(eps=1e-3), against a learned anchor,
              and F.cosine_similarity beside them
  Signs       torch.sign(h) * h, x.sign() (gradient zero)
  KMeans      fixed centres, a registered buffer, read as centers.unsqueeze(0) and centers[None] (Constant nodes)
  BufferMask  self.mask[None] == 0 of a registered tril in masked_fill: a buffer's view still a mask (MaskedFill)
  Pools       nn.LPPool2d (p 2; p 3 with a (2, 3) kernel, stride (1, 2), ceil_mode), nn.LPPool1d (p 1.5) and
              F.lp_pool2d: PyTorch's own composition (Pow, AvgPool, Sign, Abs, ReLU, Mul, MulConstant, Pow)

Every parameter is moved off its initial value, psd started with --init-from those values, and each model checked
by check_rnn.checked: the input gradient, check_resnet.py's run() with ref64 (psd's initial parameters named and
valued as the state_dict, the eval and training forwards, every parameter gradient of one backward against float64
autograd within 8x PyTorch float32's own error or 1e-4 of the tensor's largest, the step, a strict
load_state_dict), then 30 SGD steps through psd on one batch, each step's loss within 1e-5 of PyTorch's own loop.
ProtoNet's and ProtoReshape's (the prototypes' Unsqueeze or Reshape of an initializer adding leading 1s: a
Parameter under its name, a Sub broadcasting the sample's (1, 8) against it), PairsL2's (F.pairwise_distance p 2,
against an anchor, F.cosine_similarity: Sub, Pow, ReduceSum, Pow; PyTorch 1.13 exports p 1 without its Abs, which
psd computes as written: NaN) and Signs' (Sign) training-mode ONNX exports through psd's ONNX import the same way,
and KMeans' refused there (its buffer, an initializer to ONNX, read at two sites).
A prototypical-network classifier (ProtoNet: distances to learned class prototypes as logits) trained by ps-train
fit through psd on 5 Gaussian clusters: test accuracy from chance (20 %) to at least 90 %. And psd-export's
refusals: torch.dist (one number for the whole batch), cdist of two computed (N, M) tensors, cdist with p 3, a
view of a parameter as a MatMul operand.

    check_dist.py BUILD_DIR TMP_DIR
"""
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_resnet as cr  # noqa: E402 (reads BUILD_DIR TMP_DIR from sys.argv, as this script takes them)
import check_rnn  # noqa: E402
import dist  # noqa: E402

BATCH = 6
CASES = [("ProtoNet", dist.ProtoNet), ("ProtoViews", dist.ProtoViews), ("Cdists", dist.Cdists),
         ("Pairs", dist.Pairs), ("Signs", dist.Signs), ("KMeans", dist.KMeans),
         ("Pools", dist.Pools), ("BufferMask", dist.BufferMask)]


def export(pe, cls, name):
    y = os.path.join(cr.TMP, name + ".yaml")
    rc = pe.main([os.path.join(HERE, "dist.py") + ":" + cls.__name__, "--seed", "3", "-o", y, "--input-shape", "6"])
    return rc, y


def inputs(seed):
    torch.manual_seed(seed)
    x = torch.randn(BATCH, 6)
    x[0, :2] = 0.0                     # exact zeros: sign 0
    return x, torch.randint(0, 3, (BATCH,))


def main():
    pe = cr.load_psd_export()
    for i, (label, cls) in enumerate(CASES):
        name = "dist_%d" % i
        rc, y = export(pe, cls, name)
        cr.check(rc == 0, "psd-export of %s" % label)
        if rc:
            continue
        model, w = cr.moved(cls, name, seed=3)
        x, target = inputs(i)
        check_rnn.checked(label, name, y, w, model, x, target, input_grad=True, steps=30)
    for label, cls in (("ProtoNet", dist.ProtoNet), ("ProtoReshape", dist.ProtoReshape), ("PairsL2", dist.PairsL2),
                       ("Signs", dist.Signs), ("ProtoT", dist.ProtoT)):
        model, _ = cr.moved(cls, label.lower() + "_onnx", seed=3)
        cr.onnx_run("%s (ONNX)" % label, model, *inputs(7), label.lower())
    model, _ = cr.moved(dist.KMeans, "kmeans_onnx", seed=3)
    path = os.path.join(cr.TMP, "kmeans.onnx")
    check_rnn.onnx_export(model, inputs(7)[0], path, "training")
    rc, said = cr.check_config(path)
    cr.check(rc != 0 and "is read by two nodes" in said, "KMeans' ONNX export refused naming the centres read "
             "twice (%s)" % said.strip()[-200:])
    prototypes_fit(pe)
    cr.refused(lambda cls, name: export(pe, cls, name), (
        (dist.DistAll, "torch.dist at"), (dist.CdistBatch, "of two computed (N, M) tensors compares every sample"),
        (dist.CdistP3, "with p 3: psd takes p 1, 2 and inf"),
        (dist.ProtoMatmulView, "reads a view of 'c'")))


def prototypes_fit(pe):
    """ps-train fit of ProtoNet (6 features, 5 prototypes) on 5 Gaussian clusters in 6-D (centres N(0, 1.5^2),
    noise N(0, 0.5^2)): the test accuracy at least 90 %."""
    rc, y = export(pe, dist.ProtoNet, "proto_fit")
    cr.check(rc == 0, "psd-export of the prototype classifier for ps-train fit")
    if rc:
        return
    g = np.random.default_rng(5)
    centres = g.normal(0, 1.5, (5, 6))
    files = {}
    for part, n in (("train", 2000), ("test", 500)):
        lab = g.integers(0, 5, n)
        x = (centres[lab] + g.normal(0, 0.5, (n, 6))).astype(np.float32)
        files[part] = (os.path.join(cr.TMP, "proto_%s_x.npy" % part), os.path.join(cr.TMP, "proto_%s_y.npy" % part))
        np.save(files[part][0], x)
        np.save(files[part][1], lab.astype(np.int64))
    check_rnn.fit_accuracy("proto_fit", y, files, 2, "a prototypical-network classifier (distances to learned class "
                           "prototypes as logits) on 5 clusters")


if __name__ == "__main__":
    cr.run_main(main)
