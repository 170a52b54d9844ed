#!/usr/bin/python3
"""tests/it_elem3.sh's Python half: users' elementwise functions (tests/export/elem3.py) through psd-export and
psd, against PyTorch:

  Extremes  torch.maximum / torch.minimum of two tensors, torch.max(a, g) and a.min(g) with g broadcast,
            torch.maximum(a, F.relu(a)) (ties: half the gradient to each operand)
  Wheres    torch.where(h > 0, h, 0.1 * h), torch.where(0.5 >= h, h, 0.0), torch.where(h < g, 1.0, g),
            torch.where(h.ge(-0.2), torch.tanh(h), -1.0), torch.where(h < h.amax(-1, keepdim=True), h, -inf)
            before a softmax
  Periodic  torch.sin, x.cos(), torch.log1p, torch.expm1
  Flips     torch.flip(h, dims=[1]), h.flip(-1), torch.fliplr(h), h.flip(1, 2)
  Masks     comparison masks multiplied in: h * (h > 0).float(), h * (h < -0.5), (h >= 0.3).to(torch.float32)

Every parameter is moved off its initial value, psd started with --init-from those values, and each model checked
by check_resnet.py's run() with ref64: psd's initial parameters named and valued as the state_dict, the eval and
training forwards, every parameter gradient of one backward against float64 autograd (within 8x PyTorch float32's
own error or 1e-4 of the tensor's largest), the input gradient, the step, a strict load_state_dict of psd's
tensors; then 30 SGD steps through psd on one batch, each step's loss within 1e-5 of PyTorch's own loop. The
training-mode ONNX exports of Extremes (Max, Min), Wheres (Where of Greater, Less - of two computed values too -,
GreaterOrEqual, LessOrEqual; where(h < g, h, g) for where(h < g, 1.0, g), which PyTorch 1.13 exports as double)
Periodic (Sin, Cos; log1p as Log of Add; without expm1, which PyTorch 1.13 does not export) and Flips
(Slices with step -1 over whole axes: Flip; without fliplr, which PyTorch 1.13 does not export) through psd's ONNX
import the same way. And psd-export's refusals: torch.where(cond)
alone, torch.flip over the batch, a comparison with inf, a buffer as Where's condition (a and b that broadcast
against the condition: tests/export/check_elem4.py).

    check_elem3.py BUILD_DIR TMP_DIR
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_resnet as cr  # noqa: E402 (reads BUILD_DIR TMP_DIR from sys.argv, as this script takes them)
import check_rnn  # noqa: E402
import elem3  # noqa: E402

BATCH = 6
CASES = [("Extremes", elem3.Extremes), ("Wheres", elem3.Wheres), ("Periodic", elem3.Periodic),
         ("Flips", elem3.Flips), ("Masks", elem3.Masks)]
FEATURES = {elem3.Flips: [4, 6]}      # per-sample input shape; the others (8,)


def export(pe, cls, name):
    y = os.path.join(cr.TMP, name + ".yaml")
    shape = ",".join(map(str, FEATURES.get(cls, [8])))
    rc = pe.main([os.path.join(HERE, "elem3.py") + ":" + cls.__name__, "--seed", "3", "-o", y,
                  "--input-shape", shape])
    return rc, y


def inputs(cls, seed):
    torch.manual_seed(seed)
    return torch.randn([BATCH] + FEATURES.get(cls, [8])), torch.randint(0, 4, (BATCH,))


def main():
    pe = cr.load_psd_export()
    for i, (label, cls) in enumerate(CASES):
        name = "elem3_%d" % i
        rc, y = export(pe, cls, name)
        cr.check(rc == 0, "psd-export of %s" % label)
        if rc:
            continue
        model, w = cr.moved(cls, name, seed=3)
        x, target = inputs(cls, i)
        check_rnn.checked(label, name, y, w, model, x, target, input_grad=True, steps=30)
    onnx_paths()
    refusals(pe)


def onnx_paths():
    """The training-mode ONNX exports (Max, Min; Where, Greater, Less, ...; Sin, Cos; Slice by -1) through psd's ONNX
    import, checked by check_resnet's run() with ref64 against the module."""
    makes = [elem3.Extremes, lambda: elem3.Wheres(number_a=False), lambda: elem3.Periodic(expm1=False),
             lambda: elem3.Flips(fliplr=False)]
    for i, (label, cls) in enumerate(CASES[:4]):
        model, _ = cr.moved(makes[i], "elem3_onnx_%d" % i, seed=3)
        cr.onnx_run(label + " (ONNX)", model, *inputs(cls, 10 + i), "elem3_%d" % i)


def refusals(pe):
    cr.refused(lambda cls, name: export(pe, cls, name), (
        (elem3.WhereIndices, "torch.where(condition) (the indices where it holds)"),
        (elem3.FlipBatch, "that flips the batch (dim 0)"),
        (elem3.CompareInf, "the comparison Less with inf"),
        (elem3.WhereBuffer, "torch.where with the tensor 'keep' of the module as its condition")))


if __name__ == "__main__":
    cr.run_main(main)
