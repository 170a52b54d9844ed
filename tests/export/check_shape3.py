#!/usr/bin/python3
"""tests/it_shape3.sh's Python half: shape forms users write beyond psd's kinds - None-indexing and unsqueeze,
nn.Unflatten, reductions to one value per sample, torch.logsumexp, torch.cumsum (tests/export/shape3.py) through
psd-export and psd, against PyTorch:

  SEGate     a squeeze-and-excitation gate written by hand: h * w[:, :, None, None], h * w.unsqueeze(-1).unsqueeze(-1),
             x[..., None]
  PerSample  h * h.mean(1)[:, None], h.view(-1, 4, 4) * h.sum(1)[:, None, None], h.amax(1, keepdim=True),
             h.std(1).unsqueeze(1) (one value per sample: per-sample shape ()), nn.Unflatten(1, (2, 8)), h.unflatten
  LogSumExp  h - torch.logsumexp(h, 1, keepdim=True), logsumexp over a middle dim, to one value per sample, on
             values whose unshifted exp overflows float32
  CumSum     torch.cumsum / x.cumsum along the only, the last and a middle per-sample dim

Every parameter is moved off its initial value, psd started with --init-from those values, and each model checked
by check_resnet.py's run() with ref64: psd's initial parameters named and valued as the state_dict, the eval and
training forwards, every parameter gradient of one backward against float64 autograd (within 8x PyTorch float32's
own error or 1e-4 of the tensor's largest), the step, a strict load_state_dict of psd's tensors; the input
gradient against float64 autograd; then 20 SGD steps through psd on one batch, each step's loss within 1e-5 of
PyTorch's own loop. Their training-mode ONNX exports (PerSample's with views for the unflattens: torch 1.13 cannot
export aten::unflatten) through psd's ONNX import the same way: ReduceMean / ReduceSum / ReduceMax to one value
per sample, Unsqueeze, ReduceLogSumExp, CumSum. And psd-export's refusals: x[None] (a dim before the batch), torch.cumsum along the batch,
torch.logsumexp over the batch.

    check_shape3.py BUILD_DIR TMP_DIR
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_resnet as cr  # noqa: E402 (reads BUILD_DIR TMP_DIR from sys.argv, as this script takes them)
import check_rnn  # noqa: E402
import shape3  # noqa: E402
from shape3 import CumSum, LogSumExp, PerSample, SEGate  # noqa: E402

BATCH = 6
CASES = [("SEGate", SEGate), ("PerSample", PerSample), ("LogSumExp", LogSumExp), ("CumSum", CumSum)]
FEATURES = {SEGate: [2, 6, 6]}      # per-sample input shapes; the others (16)


def export(pe, cls, name):
    y = os.path.join(cr.TMP, name + ".yaml")
    shape = ",".join(map(str, FEATURES.get(cls, [16])))
    rc = pe.main([os.path.join(HERE, "shape3.py") + ":" + cls.__name__, "--seed", "3", "-o", y,
                  "--input-shape", shape])
    return rc, y


def inputs(cls, seed):
    torch.manual_seed(seed)
    return torch.randn([BATCH] + FEATURES.get(cls, [16])), torch.randint(0, 4, (BATCH,))


def main():
    pe = cr.load_psd_export()
    for i, (label, cls) in enumerate(CASES):
        name = "shape3_%d" % i
        rc, y = export(pe, cls, name)
        cr.check(rc == 0, "psd-export of %s" % label)
        if rc:
            continue
        model, w = cr.moved(cls, name, seed=3)
        x, target = inputs(cls, i)
        if cls is LogSumExp:
            with torch.no_grad():
                h = model.lin(x) * model.scale
            cr.check(torch.isinf(torch.exp(h)).any().item(),
                     "LogSumExp's inputs overflow an unshifted exp (max %.1f)" % h.max().item())
        check_rnn.checked(label, name, y, w, model, x, target, input_grad=True, steps=20)
    onnx_paths()
    refusals(pe)


def onnx_paths():
    """The models' training-mode ONNX exports through psd's ONNX import, checked as above: SEGate's (ReduceMean,
    Unsqueeze), PerSample's with views for the unflattens (ReduceMean, ReduceSum, ReduceMax to one value per sample
    and Unsqueeze), LogSumExp's (ReduceLogSumExp kept, over a middle axis and to one value per sample), CumSum's
    (CumSum along three axes)."""
    for i, (label, make) in enumerate((("SEGate", SEGate), ("PerSample", lambda: PerSample(unflatten=False)),
                                       ("LogSumExp", LogSumExp), ("CumSum", CumSum))):
        model, _ = cr.moved(make, "shape3_onnx_%d" % i, seed=3)
        x, target = inputs(SEGate if label == "SEGate" else CumSum, 10 + i)
        cr.onnx_run(label + " (ONNX)", model, x, target, "shape3_%d" % i)


def refusals(pe):
    cr.refused(lambda cls, name: export(pe, cls, name), (
        (shape3.NoneBatch, "adds a dim before the batch"),
        (shape3.CumBatch, "cumsum along dim 0: psd sums along a constant dim after the batch"),
        (shape3.LseBatch, "logsumexp over dim [0]")))


if __name__ == "__main__":
    cr.run_main(main)
