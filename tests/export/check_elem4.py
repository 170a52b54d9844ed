#!/usr/bin/python3
"""tests/it_elem4.sh's Python half: users' fills and masks (tests/export/elem4.py) through psd-export and psd,
against PyTorch:

  Fills   torch.maximum(h, torch.zeros_like(h)), torch.where(h > 0, h, torch.zeros_like(h)), h + torch.ones_like(h),
          torch.minimum(h, torch.full_like(h, 0.25)), h.new_full(h.shape, 0.5), h.new_ones(h.size())
  States  x.new_zeros(x.size(0), 16) as an initial state (wider than x: a Pad), x.new_ones(x.size(0), 4) (narrower:
          a Narrow), x.new_full((x.size(0), 2, 3), 0.1) (of two dims: a Reshape) - each a Where of two numbers
  Masked  masked_fill with masks computed from the input: h < 0, h > 0.5 (torch.masked_fill), m == 0 of a computed
          0/1 m (fill -1e9 before a softmax), m != 1, ~(g > 0.2), g.bool(), h == h.amax(-1, keepdim=True)
  Broadcasts  torch.where whose condition, a and b broadcast ((N, 6) and (N, 1); (N, 3, 1), (N, 3, 4), (N, 1, 4)),
          masked_fill by a mask that broadcasts ((N, 1) of (N, 6), (N, 1, 4) of (N, 3, 4)): Concats of copies
  PadAttention  attention over int64 ids written by hand with the padding mask users build: mask = (ids !=
          0).unsqueeze(1) (Eq, Where), scores.masked_fill(mask == 0, -1e9) and masked_fill(~mask, -inf) before a
          softmax (no input gradient: the ids have none)

Every parameter is moved off its initial value, psd started with --init-from those values, and each model checked
by check_rnn.checked (check_resnet.py's run() with ref64): psd's initial parameters named and valued as the
state_dict, the eval and training forwards, every parameter gradient of one backward against float64 autograd
(within 8x PyTorch float32's own error or 1e-4 of the tensor's largest) - zeros_like's zero gradient to h
included -, the input gradient, the step, a strict load_state_dict of psd's tensors; then 30 SGD steps through psd
on one batch, each step's loss within 1e-5 of PyTorch's own loop. Masked's training-mode ONNX export (masked_fill as
Where of Less / Greater, Equal of a computed float value and a number or of two (h == amax), Not, Cast of a float to
bool) and Broadcasts' (Where of a condition, a and b that broadcast) through psd's ONNX import, checked by
check_resnet's run() with ref64 the same way. And psd-export's
refusals: sizes without the batch, a NaN fill, a fill of
int64, masked_fill_ of a tensor read after.

    check_elem4.py BUILD_DIR TMP_DIR
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_resnet as cr  # noqa: E402 (reads BUILD_DIR TMP_DIR from sys.argv, as this script takes them)
import check_rnn  # noqa: E402
import elem4  # noqa: E402

BATCH = 6
CASES = [("Fills", elem4.Fills), ("States", elem4.States), ("Masked", elem4.Masked), ("Broadcasts", elem4.Broadcasts),
         ("PadAttention", elem4.PadAttention)]


def export(pe, cls, name):
    y = os.path.join(cr.TMP, name + ".yaml")
    more = ["--input-shape", "6", "--input-dtype", "int64"] if cls is elem4.PadAttention else ["--input-shape", "8"]
    rc = pe.main([os.path.join(HERE, "elem4.py") + ":" + cls.__name__, "--seed", "3", "-o", y] + more)
    return rc, y


def inputs(seed, cls=None):
    torch.manual_seed(seed)
    if cls is elem4.PadAttention:    # ids 1..19, then 0 (the pad) from a length of 1 to 6 on
        ids = torch.randint(1, 20, (BATCH, 6))
        for i, n in enumerate(torch.randint(1, 7, (BATCH,)).tolist()):
            ids[i, n:] = 0
        return ids, torch.randint(0, 4, (BATCH,))
    return torch.randn(BATCH, 8), torch.randint(0, 4, (BATCH,))


def main():
    pe = cr.load_psd_export()
    for i, (label, cls) in enumerate(CASES):
        name = "elem4_%d" % i
        rc, y = export(pe, cls, name)
        cr.check(rc == 0, "psd-export of %s" % label)
        if rc:
            continue
        model, w = cr.moved(cls, name, seed=3)
        x, target = inputs(i, cls)
        check_rnn.checked(label, name, y, w, model, x, target, input_grad=x.is_floating_point(), steps=30)
    model, _ = cr.moved(elem4.Masked, "elem4_onnx_2", seed=3)
    cr.onnx_run("Masked (ONNX)", model, *inputs(12), "elem4_2")
    model, _ = cr.moved(elem4.Broadcasts, "elem4_onnx_3", seed=3)
    cr.onnx_run("Broadcasts (ONNX)", model, *inputs(13), "elem4_3")
    refusals(pe)


def refusals(pe):
    cr.refused(lambda cls, name: export(pe, cls, name), (
        (elem4.NoBatch, "the fill of size (4, 6) (the batch is 2): psd's values have the batch as dim 0"),
        (elem4.FillNaN, "the fill with the fill value nan"),
        (elem4.FillLong, "the fill of dtype int64"),
        (elem4.InPlaceShared, "fills 'lin' in place, which is read elsewhere too")))


if __name__ == "__main__":
    cr.run_main(main)
