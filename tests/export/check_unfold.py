#!/usr/bin/python3
"""tests/it_unfold.sh's Python half: F.unfold / nn.Unfold (im2col) and F.fold / nn.Fold (col2im) as users write them
(tests/export/unfold.py) through psd-export and psd, against PyTorch:

  PatchEmbed  a hand-written ViT patch embedding: F.unfold(x, kernel_size=4, stride=4) -> transpose -> nn.Linear
  LocalConv   nn.Unfold with a non-square kernel, dilation, padding and stride as a custom convolution (transpose ->
              nn.Linear), then F.unfold -> sigmoid -> nn.Fold (overlaps summed back)
  FoldStride  F.fold of input columns with stride 2, padding, dilation (pixels no window reads: zeros) -> Conv2d

Every parameter is moved off its initial value, psd started with --init-from those values, and each model checked
by check_resnet.py's run() with ref64 (check_rnn.checked): psd's initial parameters named and valued as the
state_dict, the eval and training forwards, every parameter gradient and the input gradient of one backward against
float64 autograd, the step, a strict load_state_dict of psd's tensors; then 30 SGD steps through psd on one batch,
each step's loss within 1e-5 of PyTorch's own loop. And psd --check-config's refusals of a Fold whose columns do not
match output_size's windows and of an Unfold whose kernel does not fit the image, naming both.

    check_unfold.py BUILD_DIR TMP_DIR
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_resnet as cr  # noqa: E402 (reads BUILD_DIR TMP_DIR from sys.argv, as this script takes them)
import check_rnn  # noqa: E402
import unfold  # noqa: E402

BATCH = 6
CASES = [("PatchEmbed", unfold.PatchEmbed, [3, 8, 8]), ("LocalConv", unfold.LocalConv, [2, 7, 4]),
         ("FoldStride", unfold.FoldStride, [12, 6])]


def export(pe, cls, name, shape):
    y = os.path.join(cr.TMP, name + ".yaml")
    rc = pe.main([os.path.join(HERE, "unfold.py") + ":" + cls.__name__, "--seed", "3", "-o", y,
                  "--input-shape", ",".join(map(str, shape))])
    return rc, y


def main():
    pe = cr.load_psd_export()
    for i, (label, cls, shape) in enumerate(CASES):
        name = "unfold_%d" % i
        rc, y = export(pe, cls, name, shape)
        cr.check(rc == 0, "psd-export of %s" % label)
        if rc:
            continue
        text = open(y).read()
        cr.check("kind: Unfold" in text or "kind: Fold" in text, "%s: its export holds Unfold / Fold nodes" % label)
        model, w = cr.moved(cls, name, seed=3)
        torch.manual_seed(20 + i)
        x, target = torch.randn([BATCH] + shape), torch.randint(0, 4, (BATCH,))
        check_rnn.checked(label, name, y, w, model, x, target, input_grad=True, steps=30)
    refusals()


def refusals():
    """psd --check-config refuses Fold and Unfold nodes whose geometry does not fit, naming the sizes."""
    for label, shape, node, want in (
            ("Fold columns", [8, 6], "{name: f, kind: Fold, output_size: 5, kernel_size: 2, stride: 2}",
             "6 columns, but output_size 5x5 holds 2x2 = 4 windows of this kernel"),
            ("Fold rows", [9, 4], "{name: f, kind: Fold, output_size: 5, kernel_size: 2, stride: 3}",
             "9 column rows are not a multiple of the 2x2 kernel's 4 positions"),
            ("Unfold kernel", [2, 4, 4], "{name: u, kind: Unfold, kernel_size: 3, dilation: 2}",
             "a 3x3 kernel (dilation 2x2) does not fit a 4x4 image padded by 0x0")):
        cr.refused_file(label, shape, node, want)


if __name__ == "__main__":
    cr.run_main(main)
