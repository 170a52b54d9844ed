#!/usr/bin/python3
"""tests/it_userops.sh's Python half: the ops users write beyond psd's kinds - reductions over a dim, the embedding
options, shape moves
(tests/export/userops.py) through psd-export and psd, against PyTorch:

  TextCNN    nn.Embedding(padding_idx=0), Conv1d, F.max_pool1d(h, h.size(2)) (a kernel read from the shape)
  MaxTokens  nn.Embedding(padding_idx=-1), torch.max(h, dim=1)[0], h.min(dim=1).values, torch.amax(h, -1,
             keepdim=True) over (N, T, H)
  Bags       nn.EmbeddingBag of modes mean, sum (padding_idx 0) and max on (N, L) bags
  MaxRows    x.max(dim=2).values and torch.amin(x, (1, 2)) of (N, 4, 6) features, the input gradient too
  ShapeMoves nn.ZeroPad2d, nn.ConstantPad2d, nn.PixelShuffle, F.pixel_unshuffle, torch.stack, nn.Softmin,
             F.layer_norm(v, v.shape[-1:]), x.repeat on images, the input gradient too
  Expands    g.unsqueeze(1).expand_as(x) and g.expand(-1, 70) (past 64 copies) of a gate, the input gradient too
  Einsums    two-head attention with torch.einsum: "bhqd,bhkd->bhqk", "bhqk,bhkd->bhqd", "...qd,...kd->...kq",
             "bhdq,bhdk->bhqk" (MatMul with transposes), the input gradient too
  Paddings   nn.ReflectionPad2d, Conv2d with padding_mode replicate and circular (a Pad, then the convolution),
             nn.ReplicationPad2d, F.pad(mode="reflect"), the input gradient too; its ONNX export as well
  Functional F.conv2d / F.conv1d / F.linear with a module's own parameters (custom layers; an nn.Linear's weight
             and bias read at two sites: one node's parameters, shared), the input gradient too
  FuncEmbedding  a custom layer's F.embedding(ids, self.weight, padding_idx=0), F.linear of a head's parameters
  BilinearNet    nn.Bilinear of two Linears of the input, and one over (3, 2) rows per sample without bias; the
                 input gradient too
  ErfGelu        a GELU written with torch.erf (BERT-era code) and torch.special.erf; the input gradient too; its
                 ONNX export as well (Erf, Div, Mul, Add: the import's GELU or an Erf node)

Every parameter is moved off its initial value (a padding row of the EmbeddingBag kept at zeros, as
PyTorch's init and training keep it), psd started with --init-from those values, and each model checked by
check_resnet.py's run() with ref64: psd's initial parameters named and valued as the state_dict, the eval and
training forwards, every parameter gradient of one backward against float64 autograd (within 8x PyTorch
float32's own error or 1e-4 of the tensor's largest), the step, a strict load_state_dict of psd's tensors.
The token ids hold the padding ids, so a padding row's gradient is PyTorch's zeros only if psd leaves it
out. Then 30 SGD steps through psd on one batch, each step's loss within 1e-5 of PyTorch's own loop (a padding
row never moves). MaxTokens' training-mode ONNX export (ReduceMax, ReduceMin over the tokens) through psd's ONNX
import the same way, and MaxRows' (a ReduceMin to one value per sample). And psd-export's refusals: an EmbeddingBag called with per_sample_weights, mode mean with
padding_idx, a padding row that is not zeros, an Embedding with max_norm, the indices of x.max(dim), x.repeat
along the batch, an einsum that is not a batched matrix product, F.linear of a transposed parameter or of
parameters not named weight / bias, torch.zeros of a traced size (torch.fx's own refusal, named with the line). A
module returning a value computed before another: that value is psd's output. Two modules of two inputs
(forward(self, a, b); --input-shape once each): TwoViews (two images through one shared encoder: psd's input
(2, 6, 6), joined along dim 1) and ImageAndFeatures (an image and 5 features: 36 + 5 values, joined), checked as the
models above against the module called on the pieces.

    check_userops.py BUILD_DIR TMP_DIR
"""
import contextlib
import io
import json
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_resnet as cr  # noqa: E402 (reads BUILD_DIR TMP_DIR from sys.argv, as this script takes them)
import check_rnn  # noqa: E402
import userops  # noqa: E402
from userops import VOCAB, Bags, Einsums, Expands, MaxRows, MaxTokens, Paddings, ShapeMoves, TextCNN  # noqa: E402


SEQ, BATCH = 7, 6
CASES = [("TextCNN", TextCNN), ("MaxTokens", MaxTokens), ("Bags", Bags), ("MaxRows", MaxRows),
         ("ShapeMoves", ShapeMoves), ("Expands", Expands), ("Einsums", Einsums), ("Paddings", Paddings),
         ("Functional", userops.Functional), ("FuncEmbedding", userops.FuncEmbedding),
         ("BilinearNet", userops.BilinearNet), ("ErfGelu", userops.ErfGelu)]
FEATURES = {MaxRows: [4, 6], ShapeMoves: [1, 6, 6], Expands: [5, 8], Einsums: [6, 8], Paddings: [1, 8, 8],
            userops.RepeatBatch: [6], userops.SoftsignNet: [6],
            userops.EinsumDot: [6], userops.Functional: [2, 6, 6], userops.LinearT: [6],
            userops.LinearNamed: [6], userops.ZerosState: [6], userops.ReturnsEarlier: [6],
            userops.BilinearNet: [6], userops.ErfGelu: [6],
            userops.PixelNet: [1, 6, 6]}      # float inputs (per sample); the others take token ids


def export(pe, cls, name, kwargs=None):
    y = os.path.join(cr.TMP, name + ".yaml")
    shape = ["--input-shape", ",".join(map(str, FEATURES[cls]))] if cls in FEATURES else \
        ["--input-shape", str(SEQ), "--input-dtype", "int64"]
    rc = pe.main([os.path.join(HERE, "userops.py") + ":" + cls.__name__, "--seed", "3", "-o", y] + shape +
                 (["--kwargs", json.dumps(kwargs)] if kwargs else []))
    return rc, y


def moved(cls, name):
    # a bag's padding row kept at zeros, as PyTorch's init and training keep it
    return cr.moved(cls, name, seed=3, after=(lambda m: m.sum.weight[0].zero_()) if cls is Bags else None)


def inputs(cls, seed):
    torch.manual_seed(seed)
    if cls in FEATURES:
        return torch.randn([BATCH] + FEATURES[cls]), torch.randint(0, 4, (BATCH,))
    x = torch.randint(0, VOCAB, (BATCH, SEQ))
    x[:, -2:] = 0                      # right padding (id 0) ...
    x[0, -1] = VOCAB - 1               # ... and MaxTokens' padding id (-1: the last row)
    x[1, 2] = VOCAB - 1
    return x, torch.randint(0, 4, (BATCH,))


def main():
    pe = cr.load_psd_export()
    for i, (label, cls) in enumerate(CASES):
        name = "userops_%d" % i
        rc, y = export(pe, cls, name)
        cr.check(rc == 0, "psd-export of %s" % label)
        if rc:
            continue
        model, w = moved(cls, name)
        x, target = inputs(cls, i)
        check_rnn.checked(label, name, y, w, model, x, target, input_grad=cls in FEATURES, steps=30)
    onnx_paths()
    refusals(pe)
    returns_earlier(pe)
    multi_inputs(pe)


def multi_inputs(pe):
    """forward(self, a, b): each --input-shape an input; psd's one input is them joined along dim 1 (shapes that
    differ only there) or flattened and joined; checked as the CASES against the module called on the pieces (its
    X subclass)."""
    for label, cls, ref, shapes in (("TwoViews", userops.TwoViews, userops.TwoViewsX, ["1,6,6", "1,6,6"]),
                                    ("ImageAndFeatures", userops.ImageAndFeatures, userops.ImageAndFeaturesX,
                                     ["1,6,6", "5"])):
        y = os.path.join(cr.TMP, label + ".yaml")
        rc = pe.main([os.path.join(HERE, "userops.py") + ":" + cls.__name__, "--seed", "3", "-o", y] +
                     [a for x in shapes for a in ("--input-shape", x)])
        cr.check(rc == 0, "psd-export of %s with two --input-shape" % label)
        if rc:
            continue
        model, w = cr.moved(ref, label, seed=3)
        torch.manual_seed(11)
        x = torch.randn(BATCH, 2, 6, 6) if cls is userops.TwoViews else torch.randn(BATCH, 41)
        target = torch.randint(0, 4, (BATCH,))
        check_rnn.checked(label, label, y, w, model, x, target, input_grad=True, steps=30)
    # a stage whose input has 4 dims per sample could never be sent (a tensor has 4 with the batch): refused
    y = os.path.join(cr.TMP, "wide_input.yaml")
    with open(y, "w") as f:
        f.write("name: wide\nstages:\n  - name: main\n    input: {shape: [2, 1, 6, 6]}\n    nodes:\n"
                "      - {name: flat, kind: Flatten}\n")
    with open(y + ".conf.yaml", "w") as f:
        f.write("model:\n  file: %s\n" % y)
    r = subprocess.run([os.path.join(cr.BUILD, "bin", "psd"), "--check-config", y + ".conf.yaml"], capture_output=True,
                       text=True, timeout=60)
    cr.check(r.returncode != 0 and "stage 'main': its input has 4 dimensions per sample" in r.stderr,
             "psd --check-config refuses a stage input of 4 dims per sample (%s)" % r.stderr.strip()[-160:])


def returns_earlier(pe):
    """A module returning a value computed before another: psd's output is that value (its node last, the
    unused one dropped), and psd-export names the tensors no node reads."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc, y = export(pe, userops.ReturnsEarlier, "returns_earlier")
    text = open(y).read() if rc == 0 else ""
    nodes = [ln for ln in text.splitlines() if ln.strip().startswith("- {name:")]
    cr.check(rc == 0 and len(nodes) == 1 and "name: a," in nodes[-1],
             "ReturnsEarlier: the returned Linear 'a' is the output, the unused 'b' dropped (%s)" % nodes)
    cr.check("not in psd's state_dict" in out.getvalue() and "b.weight, b.bias" in out.getvalue(),
             "ReturnsEarlier: psd-export names b's tensors as unread")


def onnx_paths():
    """MaxTokens' training-mode ONNX export (ReduceMax over the tokens, ReduceMin, ReduceMax over the features
    with keepdims) through psd's ONNX import, checked as above; its ids without the padding id (ONNX does not
    carry padding_idx, so psd's Embedding there gives that row gradients as a plain Gather's). MaxRows' export
    (a ReduceMin to one value per sample) the same way, PixelNet's (nn.PixelShuffle as DepthToSpace) and
    Einsums' (ONNX's Einsum as MatMuls)."""
    model, _ = moved(MaxTokens, "userops_onnx")
    x, target = inputs(MaxTokens, 1)
    x[x == VOCAB - 1] = 3
    cr.onnx_run("MaxTokens (ONNX)", model, x, target, "maxtokens")
    # ONNX's Pad in modes reflect and edge; without the circular convolution (PyTorch 1.13's export of circular
    # padding slices the wrong rows: pytorch/pytorch#86690)
    model, _ = moved(lambda: Paddings(circular=False), "paddings_onnx")
    cr.onnx_run("Paddings (ONNX)", model, *inputs(Paddings, 2), "paddings")
    model, _ = moved(userops.ErfGelu, "erfgelu_onnx")       # a hand-written GELU, and Erf of a feature alone
    cr.onnx_run("ErfGelu (ONNX)", model, *inputs(userops.ErfGelu, 4), "erfgelu")
    model, _ = moved(userops.SoftsignNet, "softsign_onnx")   # Softsign as Abs, Add, Div (broadcasting Div's path)
    cr.onnx_run("SoftsignNet (ONNX)", model, *inputs(userops.SoftsignNet, 3), "softsign")
    model, _ = moved(MaxRows, "maxrows_onnx")     # a ReduceMin to one value per sample (per-sample shape ())
    cr.onnx_run("MaxRows (ONNX)", model, *inputs(MaxRows, 4), "maxrows")
    model, _ = moved(userops.PixelNet, "pixelnet_onnx")     # nn.PixelShuffle as DepthToSpace (mode CRD)
    cr.onnx_run("PixelNet (ONNX)", model, *inputs(userops.PixelNet, 5), "pixelnet")
    model, _ = moved(Einsums, "einsums_onnx")     # ONNX's Einsum: MatMuls with transposes, an output transposed
    cr.onnx_run("Einsums (ONNX)", model, *inputs(Einsums, 6), "einsums")


def refusals(pe):
    cr.refused(lambda cls, name: export(pe, cls, name), (
        (userops.BagWeights, "called with per_sample_weights"), (userops.BagMeanPad, "mode 'mean' with padding_idx"),
        (userops.BagPadRow, "padding row 1 is not zeros"), (userops.MaxNorm, "Embedding with max_norm=1.0"),
        (userops.ArgMax, "the indices of"),
        (userops.RepeatBatch, "repeat(2, 1) of a 2-d tensor (psd repeats dims after the batch"),
        (userops.EinsumDot, "einsum 'bi,bi->b' is not a batched matrix product"),
        (userops.LinearT, "its weight is a computed tensor (a transpose or view of a parameter)"),
        (userops.LinearNamed, "W are not one module's weight and bias"),
        (userops.ZerosState, "torch.fx cannot trace")))


if __name__ == "__main__":
    cr.run_main(main)
