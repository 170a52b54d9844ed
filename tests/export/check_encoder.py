#!/usr/bin/python3
"""tests/it_encoder.sh's Python half: nn.TransformerEncoder and
nn.TransformerEncoderLayer (tests/export/encoder.py) through psd-export,
trained one step through psd against PyTorch:

  TextClassifier  token ids -> nn.Embedding -> nn.TransformerEncoder (2
                  layers) -> the mean over the tokens -> nn.Linear:
                  batch_first=True post-norm (activation "relu");
                  batch_first=True pre-norm (F.gelu, layer_norm_eps 1e-6,
                  a final LayerNorm, a causal float mask buffer);
                  batch_first=False (the embedded tokens transposed to
                  (T, N, E), the mean over dim 0; "gelu", a causal bool mask
                  buffer, a final LayerNorm); src_key_padding_mask = ids
                  == 0 pre-norm, and batch_first=False beside the causal
                  float mask, on ids padded at the end (an Eq node every
                  layer's attention reads; the padding changes the output;
                  psd's start-up kernel check runs; the pre-norm one also
                  through its training-mode ONNX export, the Equal of the ids
                  an Eq node each layer's attention reads);
  LayerClassifier features -> nn.Linear -> one nn.TransformerEncoderLayer
                  (3 heads, nn.GELU(), pre-norm) -> nn.Linear of the
                  flattened sequence, its input gradient too.

Every parameter is moved off its initial value first (LayerNorms off 1 and
0), and psd started with --init-from those values. Each is checked by
tests/export/check_resnet.py's run() with ref64: psd's initial parameters
are the module's exactly and named as its state_dict
(encoder.layers.0.self_attn.in_proj_weight, .linear1.weight,
.norm1.weight, ...), the eval and training forwards, every parameter
gradient of one backward against float64 autograd (within 8x PyTorch
float32's own error or 1e-4 of the tensor's largest), the step's new
weights, psd's tensors loading into the module with
load_state_dict(strict=True), and the eval forward after the step.

Then the model file itself: the kinds psd-export writes for each layout
(pre-norm's LayerNorm before the attention, post-norm's after the Add),
dropout as Dropout nodes and MultiheadAttention's dropout, a training
forward with dropout differing from the eval one; and refusals naming
what: a mask that is not the causal one, an
activation other than ReLU and GELU, a (T, N, E) tensor returned.

    check_encoder.py BUILD_DIR TMP_DIR
"""
import copy
import json
import os
import random
import subprocess
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import check_resnet as cr  # noqa: E402 (reads BUILD_DIR TMP_DIR from sys.argv, as this script takes them)
from encoder import LayerClassifier, TextClassifier  # noqa: E402
from psd._proto import ps_pb2  # noqa: E402  (check_resnet put python/ on the path)

sys.path.insert(0, os.path.join(ROOT, "scripts"))
from gen_golden import write_safetensors  # noqa: E402

SEQ, VOCAB = 6, 20

CASES = [
    # (label, class, kwargs)
    ("TransformerEncoder batch_first post-norm relu", TextClassifier, {}),
    ("TransformerEncoder batch_first pre-norm F.gelu eps 1e-6, final norm, causal float mask", TextClassifier,
     {"norm_first": True, "activation": "F.gelu", "layer_norm_eps": 1e-6, "final_norm": True, "mode": "causal"}),
    ("TransformerEncoder batch_first=False post-norm gelu, final norm, causal bool mask", TextClassifier,
     {"batch_first": False, "activation": "gelu", "final_norm": True, "mode": "causal_bool"}),
    ("TransformerEncoderLayer pre-norm nn.GELU 3 heads", LayerClassifier, {"activation": "nn.GELU"}),
    # key padding masks: src_key_padding_mask = ids == 0 (an Eq node every layer's attention reads)
    ("TransformerEncoder batch_first pre-norm, src_key_padding_mask", TextClassifier,
     {"norm_first": True, "mode": "padding"}),
    ("TransformerEncoder batch_first=False, causal float mask and src_key_padding_mask", TextClassifier,
     {"batch_first": False, "mode": "causal_padding", "final_norm": True}),
]


ONNX = {0: 13, 1: 17, 3: 13, 4: 13}   # CASES through their training-mode ONNX exports, at these opsets (4:
# src_key_padding_mask: Equal of the ids as one Eq node, each layer's exported mask chain its attention's input)


def export(pe, cls, kwargs, name, seed=7):
    y = os.path.join(cr.TMP, name + ".yaml")
    shape = ["--input-shape", str(SEQ), "--input-dtype", "int64"] if cls is TextClassifier else \
        ["--input-shape", "%d,5" % SEQ]
    rc = pe.main([os.path.join(HERE, "encoder.py") + ":" + cls.__name__, "--kwargs", json.dumps(kwargs),
                  "--seed", str(seed), "-o", y] + shape)
    with open(y) if rc == 0 else open(os.devnull) as f:
        return rc, y, f.read()


def run_export(cls, kwargs):
    """psd-export's stderr for the model (it must fail)."""
    shape = ["--input-shape", str(SEQ), "--input-dtype", "int64"] if cls is TextClassifier else \
        ["--input-shape", "%d,5" % SEQ]
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "psd-export"),
                        os.path.join(HERE, "encoder.py") + ":" + cls.__name__, "--kwargs", json.dumps(kwargs),
                        "-o", os.path.join(cr.TMP, "refused.yaml")] + shape, capture_output=True, text=True,
                       timeout=300)
    return r.stderr if r.returncode else "exit 0: " + r.stdout


def inputs(cls, seed, padded=False):
    torch.manual_seed(seed)
    if cls is TextClassifier and padded:   # pad id 0 at the end of three of the four samples: 0, 2, 4 and 1 pads
        ids = torch.randint(1, VOCAB, (4, SEQ))
        for i, k in enumerate((0, 2, 4, 1)):
            ids[i, SEQ - k:] = 0
        return ids, torch.randint(0, 5, (4,))
    if cls is TextClassifier:
        return torch.randint(0, VOCAB, (4, SEQ)), torch.randint(0, 5, (4,))
    return torch.randn(4, SEQ, 5), torch.randint(0, 5, (4,))


def main():
    pe = cr.load_psd_export()
    for i, (label, cls, kw) in enumerate(CASES):
        name = "encoder_%d" % i
        rc, y, text = export(pe, cls, kw, name)
        cr.check(rc == 0, "psd-export of %s" % label)
        if rc:
            continue
        torch.manual_seed(7)
        model = cls(**kw)
        with torch.no_grad():   # LayerNorms off 1 and 0, biases off 0: every gradient shows
            for t in model.parameters():
                t.add_(torch.randn_like(t) * 0.1)
        w = os.path.join(cr.TMP, name + "_moved.safetensors")
        write_safetensors(w, dict(model.state_dict()), {})
        padded = "padding" in kw.get("mode", "")
        x, target = inputs(cls, i, padded)
        if padded:
            cr.check(text.count("kind: Eq") == 1 and text.count(", eq]") == 2 and "value: 0" in text,
                     "%s: one Eq node of the ids (value 0), read by every layer's attention" % label)
            with torch.no_grad():
                plain = copy.deepcopy(model).eval()
                plain.mode = "causal" if kw["mode"] == "causal_padding" else "plain"
                cr.check(not torch.allclose(plain(x), model.eval()(x)), "%s: the padding mask changes the output "
                         "(the test sees it)" % label)
        if kw.get("mode", "").startswith("causal"):     # the buffer is not persistent: not in the state_dict
            with torch.no_grad():
                plain = copy.deepcopy(model).eval()
                del plain.mask
                if plain.mode == "causal_padding":
                    plain.mode = "padding"
                cr.check(not torch.allclose(plain(x), model.eval()(x)), "%s: the mask changes the output (the test "
                         "sees it)" % label)
        stub, p = cr.start_psd(name, "file: %s" % y, ["--init-from", w])
        if padded:   # the start-up kernel check's probe ids are not all padding
            with open(os.path.join(cr.TMP, name + ".log")) as f:
                log = f.read()
            cr.check("training kernels:" in log and "kernel check failed" not in log,
                     "%s: psd's start-up kernel check runs (%s)" % (label, log.strip()[-200:]))
        if cls is LayerClassifier:
            cr.input_gradient(label, stub, model, x, target)
        cr.run(label, stub, copy.deepcopy(model), x, target, ref64=True)
        p.kill()
        if i in ONNX:
            onnx(name, label, model, x, target, ONNX[i])
    path = os.path.join(cr.TMP, "encoder_seqfirst.onnx")
    torch.onnx.export(TextClassifier(batch_first=False).train(), inputs(TextClassifier, 0)[0], path,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False, opset_version=13)
    rc, out = cr.check_config(path)
    want = "node '/Transpose' (Transpose): nn.MultiheadAttention: batch_first=False: the (L, N, E) value it " \
           "projects ('/Transpose_output_0') is read by 2 nodes"
    cr.check(rc != 0 and want in out, "ONNX import refuses batch_first=False saying '%s' (%s)"
             % (want, out.strip()[-300:]))
    structure(pe)
    refusals()


def onnx(name, label, model, x, target, opset):
    """The module's training-mode ONNX export at opset: psd's importer reads each layer's attention back as one
    MultiheadAttention (the causal mask as causal: true), ReduceMean over the tokens as Reshape and
    AdaptiveAvgPool2d; trained one step as above."""
    path = os.path.join(cr.TMP, "%s_%d.onnx" % (name, opset))
    m = copy.deepcopy(model).train()
    torch.onnx.export(copy.deepcopy(m), x, path, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      opset_version=opset)
    label = "%s, ONNX training export opset %d" % (label, opset)
    stub, p = cr.start_psd("%s_onnx_%d" % (name, opset), "onnx: %s" % path, [])
    if x.is_floating_point():
        cr.input_gradient(label, stub, m, x, target)
    cr.run(label, stub, m, x, target, ref64=True)
    p.kill()


def nodes(text):
    return [ln.strip() for ln in text.splitlines() if ln.strip().startswith("- {name:")]


def structure(pe):
    """What the model files say: pre- and post-norm orders, Dropout where p > 0, the layout of batch_first=False,
    the mean over the tokens; and a training forward with dropout drops."""
    _, _, post = export(pe, TextClassifier, {}, "encoder_post")
    _, _, pre = export(pe, TextClassifier, {"norm_first": True}, "encoder_pre")
    names = lambda t: [ln.split(",")[0][len("- {name: "):] for ln in nodes(t)]   # noqa: E731
    cr.check(names(post)[1:5] == ["encoder.layers.0.self_attn", "encoder.layers.0.add", "encoder.layers.0.norm1",
                                  "encoder.layers.0.linear1"],
             "post-norm: self_attn, the residual Add, then norm1 (%s)" % names(post)[1:5])
    cr.check(names(pre)[1:5] == ["encoder.layers.0.norm1", "encoder.layers.0.self_attn", "encoder.layers.0.add",
                                 "encoder.layers.0.norm2"],
             "pre-norm: norm1, self_attn, the residual Add, then norm2 (%s)" % names(pre)[1:5])
    cr.check(names(post)[-4:] == ["mean_view", "mean", "mean_view_1", "head"] and
             "kind: AdaptiveAvgPool2d, output_size: [1, null]" in post,
             "x.mean(dim=1) over the tokens: Reshape [1, T, E], AdaptiveAvgPool2d [1, null], Reshape [E]")
    rc, y, drop = export(pe, TextClassifier, {"dropout": 0.25}, "encoder_dropout")
    want = ["encoder.layers.0.self_attn, kind: MultiheadAttention, embed_dim: 16, num_heads: 4, dropout: 0.25",
            "encoder.layers.0.dropout1, kind: Dropout, p: 0.25", "encoder.layers.0.dropout, kind: Dropout, p: 0.25",
            "encoder.layers.0.dropout2, kind: Dropout, p: 0.25"]
    cr.check(rc == 0 and all(w in drop for w in want), "dropout 0.25: the attention's dropout and Dropout nodes "
             "dropout1, dropout (after the activation) and dropout2")
    _, _, seqf = export(pe, TextClassifier, {"batch_first": False}, "encoder_seqfirst")
    cr.check(nodes(seqf) == nodes(post), "batch_first=False with x.transpose(0, 1) and x.mean(dim=0): the same "
             "nodes as batch_first=True (psd holds the batch first)")
    x, _ = inputs(TextClassifier, 9)
    stub, p = cr.start_psd("encoder_dropout", "file: %s" % y, ["--init-from", y[:-5] + ".safetensors"])
    a = cr.array(stub.Forward(ps_pb2.ForwardRequest(input=cr.tensor(x.numpy()), train=False), timeout=60).output)
    b = cr.array(stub.Forward(ps_pb2.ForwardRequest(context_id=random.randint(1, 1 << 60), seq=0, train=True,
                                                    trainer_rank=1, input=cr.tensor(x.numpy())), timeout=60).output)
    cr.check(not np.allclose(a, b), "dropout 0.25: a training forward drops (differs from the eval one)")
    p.kill()


def refusals():
    for kw, want in (
            ({"mode": "other"}, "its mask (from the buffer mask) is a bool mask other than the causal one: "
                                "[[0, 0, 1, 1, 1, 1], "),
            ({"activation": "F.silu"}, "the activation of 'encoder.layers.0' is 'silu': psd-export takes 'relu', "
                                       "'gelu', F.relu, F.gelu, nn.ReLU() and nn.GELU()"),
            ({"batch_first": False, "mode": "return_seq"}, "the module's output reads 'encoder', a (T, N, ...) "
                                                            "tensor: method Tensor.transpose at "
                                                            "tests/export/encoder.py:"),
            ({"batch_first": False, "mode": "return_seq"}, "(`x = x.transpose(0, 1)                   # (T, N, E)`) "
                                                            "moves the batch dimension to dim 1")):
        err = run_export(TextClassifier, kw)
        cr.check(want in err, "psd-export refuses TextClassifier %s saying '%s' (%s)" % (kw, want, err.strip()[-300:]))


if __name__ == "__main__":
    cr.run_main(main)
