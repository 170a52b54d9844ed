#!/usr/bin/python3
"""tests/it_attention.sh's Python half: attention written by hand
(tests/export/attention.py: minGPT's CausalSelfAttention without its mask,
in a small classifier) through psd, against PyTorch, both ways:

  psd-export  the model file and weights psd-export writes (MatMul with
              transpose_b for q @ k.transpose(-2, -1), MulConstant for the
              / sqrt(head size), Reshape of sizes computed from x.size(),
              Permute for the transposes, Narrow for the split), psd started
              with --init-from the weights;
  onnx        the module's training-mode ONNX export (opset 13, as
              tests/export/zoo.py does: Split, MatMul of two computed
              values, Div by a Constant, Reshapes of constant shapes),
              psd started with model.onnx; and again at opset 17 with a
              dynamic batch (the Reshapes' shapes computed by Shape,
              Gather, Unsqueeze and Concat of the input's shape).

Then nn.MultiheadAttention (attention.py's MHABlock) through its
training-mode exports at opsets 13 and 14 (and with bias=False, 3 heads) and its eval export (in_proj_weight
folded transposed into onnx::MatMul_N): psd's importer reads the
decomposition back as one MultiheadAttention node named as the module's
parameters are (attn.in_proj_weight, ...), checked as above; with dropout
0.25 a training forward drops; its exports with a mask, with
cross-attention, with need_weights=True and with a dynamic batch (opset
17) are refused by psd --check-config naming what.

Each is checked by tests/export/check_resnet.py's run(): psd's initial
parameters are the module's exactly, the eval and training forwards, one
backward (every parameter gradient within 1e-4 of each tensor's largest
|gradient| of PyTorch autograd; the input gradient too, below), the step's
new weights, psd's tensors loading into the module with
load_state_dict(strict=True), and the eval forward after the step.

    check_attention.py BUILD_DIR TMP_DIR
"""
import copy
import os
import random
import subprocess
import sys


import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import check_resnet as cr  # noqa: E402 (reads BUILD_DIR TMP_DIR from sys.argv, as this script takes them)
from attention import AttentionClassifier, CausalClassifier, MHABlock, ParamAttention  # noqa: E402
from psd._proto import ps_pb2  # noqa: E402  (check_resnet put python/ on the path)

SHAPE = (6, 5)          # tokens, features per token


def main():
    pe = cr.load_psd_export()
    torch.manual_seed(0)
    x = torch.randn(4, *SHAPE)
    target = torch.randint(0, 10, (4,))

    # 1. psd-export
    y = os.path.join(cr.TMP, "attention.yaml")
    rc = pe.main([os.path.join(HERE, "attention.py") + ":AttentionClassifier", "--input-shape",
                  ",".join(map(str, SHAPE)), "--seed", "3", "-o", y])
    cr.check(rc == 0, "psd-export of the attention classifier")
    with open(y) as f:
        text = f.read()
    cr.check("kind: MatMul" in text and "transpose_b: true" in text and "kind: MulConstant, value: 0.5" in text,
             "psd-export: q @ k.transpose(-2, -1) is a MatMul with transpose_b, / sqrt(4) a MulConstant 0.5")
    torch.manual_seed(3)
    model = AttentionClassifier()
    w = os.path.join(cr.TMP, "attention.safetensors")
    stub, p = cr.start_psd("attention_export", "file: %s" % y, ["--init-from", w])
    cr.input_gradient("attention psd-export", stub, model, x, target)
    cr.run("attention psd-export", stub, copy.deepcopy(model), x, target)
    p.kill()

    # 2. the training-mode ONNX export
    path = os.path.join(cr.TMP, "attention_train.onnx")
    m2 = copy.deepcopy(model).train()
    torch.onnx.export(m2, x, path, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      opset_version=13)
    stub, p = cr.start_psd("attention_onnx", "onnx: %s" % path, [])
    cr.input_gradient("attention onnx training export", stub, m2, x, target)
    cr.run("attention onnx training export", stub, m2, x, target)
    p.kill()

    # 3. the same with a dynamic batch at opset 17: the view's sizes are Shape, Gather, Unsqueeze and Concat of
    # the input's shape (the batch symbolic), folded to the Reshapes' shapes; LayerNormalization is one op
    path = os.path.join(cr.TMP, "attention_dyn.onnx")
    m3 = copy.deepcopy(model).train()
    torch.onnx.export(m3, x, path, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      opset_version=17, input_names=["x"], dynamic_axes={"x": {0: "batch"}})
    stub, p = cr.start_psd("attention_dyn", "onnx: %s" % path, [])
    cr.input_gradient("attention onnx export, dynamic batch", stub, m3, x, target)
    cr.run("attention onnx export, dynamic batch", stub, m3, x, target)
    p.kill()

    # 4. nn.MultiheadAttention through its exports
    mha(x, target)

    # 5. attention masks through psd-export
    masks(pe, target)

    # 6. key padding masks computed from the token ids
    padding(pe, target)

    # 7. raw parameters and broadcast matmuls
    param_matmuls(pe, x, target)


def param_matmuls(pe, x, target):
    """attention.py's ParamAttention (a custom layer x @ self.W + self.b, per-head W_q (H, E, d) under a
    (N, 1, T, E) input, multi-query k and v broadcast over the heads, x @ W_o.t(), a vector per sample times
    W) through psd-export: MatMul nodes with `parameter: null` named by each tensor's state_dict name, the
    transposed W_o read in place (transpose_b), broadcast MatMuls of computed operands; trained one step
    against float64 autograd. Refused, naming it: a parameter's transpose read by anything but a MatMul."""
    y = os.path.join(cr.TMP, "param_attention.yaml")
    rc = pe.main([os.path.join(HERE, "attention.py") + ":ParamAttention", "--input-shape", ",".join(map(str, SHAPE)),
                  "--seed", "5", "-o", y])
    cr.check(rc == 0, "psd-export of attention written with raw parameters (x @ self.W)")
    with open(y) as f:
        text = f.read()
    for line in ("{name: inp.W, kind: MatMul, parameter: null, shape: [5, 8]}",
                 "{name: W_q, kind: MatMul, parameter: null, shape: [2, 8, 4]}",
                 "{name: matmul, kind: MatMul, inputs: [W_q, W_k], transpose_b: true}",
                 "{name: W_o, kind: MatMul, transpose_b: true, parameter: null, shape: [8, 8]}",
                 "{name: head.W, kind: MatMul, parameter: null, shape: [48, 10]}"):
        cr.check(line in text, "psd-export of ParamAttention writes %s" % line)
    torch.manual_seed(5)
    model = ParamAttention()
    w = os.path.join(cr.TMP, "param_attention.safetensors")
    stub, p = cr.start_psd("param_attention", "file: %s" % y, ["--init-from", w])
    cr.input_gradient("raw-parameter attention psd-export", stub, model, x, target)
    cr.run("raw-parameter attention psd-export", stub, copy.deepcopy(model), x, target, ref64=True)
    p.kill()
    # its training-mode ONNX export: MatMuls by initializers (W_q (H, E, d), W_k, the transposed W_o's
    # Transpose folded or read, head.W) and of computed values broadcast over the heads
    path = os.path.join(cr.TMP, "param_attention.onnx")
    m2 = copy.deepcopy(model).train()
    torch.onnx.export(m2, x, path, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      opset_version=13)
    stub, p = cr.start_psd("param_attention_onnx", "onnx: %s" % path, [])
    cr.input_gradient("raw-parameter attention onnx export", stub, m2, x, target)
    cr.run("raw-parameter attention onnx export", stub, m2, x, target, ref64=True)
    p.kill()
    src = os.path.join(cr.TMP, "wt.py")
    with open(src, "w") as f:
        f.write("import torch\nimport torch.nn as nn\n\n\nclass M(nn.Module):\n    def __init__(self):\n"
                "        super().__init__()\n        self.W = nn.Parameter(torch.randn(5, 6))\n\n"
                "    def forward(self, x):\n        return x + torch.sigmoid(self.W.t())\n")
    err = run_export([src + ":M", "--input-shape", "6,5", "-o", os.path.join(cr.TMP, "wt.yaml")])
    cr.check("the transpose of 'W' is read by" in err and "as a MatMul operand" in err,
             "psd-export refuses a parameter's transpose read by a sigmoid, naming it (%s)" % err.strip()[-200:])


def padding(pe, target):
    """nn.MultiheadAttention(h, h, h, key_padding_mask=ids == pad) (attention.py's PaddedMHA: ==, ids.eq(pad),
    and == beside a causal attn_mask) through psd-export: an Eq node of the ids (pad id 0) as
    MultiheadAttention's second input, trained one step against float64 autograd on ids with several keys
    padded, all but one, in the middle and none; what psd-export does not take refused naming it."""
    from attention import PaddedMHA
    ids = torch.tensor([[5, 3, 0, 0, 0, 0], [7, 0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6], [4, 8, 0, 9, 0, 2]])
    for mode in ("eq", "method", "causal"):
        y = os.path.join(cr.TMP, "padded_%s.yaml" % mode)
        rc = pe.main([os.path.join(HERE, "attention.py") + ":PaddedMHA", "--kwargs", '{"mode": "%s"}' % mode,
                      "--input-shape", "6", "--input-dtype", "int64", "--seed", "8", "-o", y])
        cr.check(rc == 0, "psd-export of nn.MultiheadAttention with key_padding_mask from the ids (%s)" % mode)
        with open(y) as f:
            text = f.read()
        cr.check("{name: eq, kind: Eq, input: input, value: 0}" in text and "inputs: [ln_1, eq]" in text and
                 ("causal: true" in text) == (mode == "causal"), "psd-export (%s): the mask is an Eq of the ids, "
                 "MultiheadAttention's second input" % mode)
        torch.manual_seed(8)
        model = PaddedMHA(mode=mode)
        with torch.no_grad():   # biases and LayerNorms away from their zeros and ones: every gradient shows
            for t in model.parameters():
                t.add_(torch.randn_like(t) * 0.1)
            plain = copy.deepcopy(model)
            plain.pad_id = -1   # no key padded
            cr.check(not torch.allclose(plain(ids), model(ids)), "PaddedMHA %s: the key padding mask changes the "
                     "output (the test sees it)" % mode)
        w = os.path.join(cr.TMP, "padded_%s_moved.safetensors" % mode)
        sd = model.state_dict()
        torch_save_st(w, {k: sd[k] for k in sd if k != "mask"})
        label = "MultiheadAttention key_padding_mask psd-export (%s)" % mode
        stub, p = cr.start_psd("padded_" + mode, "file: %s" % y, ["--init-from", w])
        cr.run(label, stub, copy.deepcopy(model), ids, target, ref64=True,
               folded=("mask",) if mode == "causal" else ())
        # every key of a sample padded: PyTorch 1.13 gives NaN there, psd refuses the Forward naming the sample
        bad = ids.clone()
        bad[1, 0] = 0
        with torch.no_grad():
            cr.check(bool(torch.isnan(model.eval()(bad)[1]).all()), "PyTorch 1.13: a sample whose keys are all "
                     "padding gives NaN")
        try:
            stub.Forward(ps_pb2.ForwardRequest(input=cr.tensor(bad.numpy()), train=False), timeout=60)
            cr.check(False, "psd refuses a sample whose keys are all padding (%s): it answered" % mode)
        except Exception as e:   # grpc.RpcError
            msg = e.details() if hasattr(e, "details") else str(e)
            want = "masks key 0 and causal is true" if mode == "causal" else "masks all 6 keys"
            cr.check("node 'attn' (MultiheadAttention): sample 1" in msg and want in msg, "psd refuses a sample "
                     "whose keys are all padding (%s), naming it (%s)" % (mode, msg))
        p.kill()
    padding_onnx(ids, target)
    for mode, want in (("ne", "its key_padding_mask is computed from the input (a per-sample mask) as function "
                              "operator.ne"),
                       ("pad_tensor", "the pad id compared with the ids at"),
                       ("short", "its key_padding_mask is (2, 5) but its query is (2, 6, 8)"),
                       ("embedded", "not the model's input ids")):
        err = run_export([os.path.join(HERE, "attention.py") + ":PaddedMHA", "--kwargs", '{"mode": "%s"}' % mode,
                          "--input-shape", "6", "--input-dtype", "int64", "-o", os.path.join(cr.TMP, "refused.yaml")])
        cr.check(want in err, "psd-export refuses PaddedMHA %s saying '%s' (%s)" % (mode, want, err.strip()[-300:]))


def padding_onnx(ids, target):
    """PaddedMHA (== and ids.eq(pad)) through its training-mode ONNX export at opset 13: Equal of the int64 ids
    and the pad id as an Eq node, the exporter's mask chain inside the attention (Reshape to (N, 1, 1, S),
    Expand over the heads, Reshape to (N*H, 1, S), Cast, Where(mask, -inf, 0)) as MultiheadAttention's second
    input; trained one step against float64 autograd. Beside a causal attn_mask the exporter merges the two
    masks otherwise: refused, naming it."""
    from attention import PaddedMHA
    for mode in ("eq", "method"):
        torch.manual_seed(8)
        model = PaddedMHA(mode=mode)
        with torch.no_grad():
            for t in model.parameters():
                t.add_(torch.randn_like(t) * 0.1)
        path = os.path.join(cr.TMP, "padded_%s.onnx" % mode)
        torch.onnx.export(copy.deepcopy(model).train(), ids, path, training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, opset_version=13)
        label = "MultiheadAttention key_padding_mask onnx export (%s)" % mode
        stub, p = cr.start_psd("padded_onnx_" + mode, "onnx: %s" % path, [])
        cr.run(label, stub, copy.deepcopy(model), ids, target, ref64=True)
        p.kill()
    path = os.path.join(cr.TMP, "padded_causal.onnx")
    torch.onnx.export(PaddedMHA(mode="causal").train(), ids, path, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, opset_version=13)
    rc, out = cr.check_config(path)
    cr.check(rc != 0 and "nn.MultiheadAttention" in out, "the ONNX export of a key_padding_mask beside a causal "
             "attn_mask is refused, naming it (%s)" % (out.strip().splitlines()[-1] if out.strip() else "no output"))


def masks(pe, target):
    """Causal attention through psd-export: minGPT's CausalSelfAttention as written upstream (its tril buffer
    of block_size 8 sliced to T: T 6 < 8 and T 8 = 8) as a MaskedFill (mask triu, diagonal 1, value -inf),
    and nn.MultiheadAttention called with a causal attn_mask (a float -inf buffer, a bool one) as
    MultiheadAttention with causal: true, each trained one step against PyTorch; masks psd does not take
    (not a triangle, not the causal one, computed from the input) refused naming them."""
    for seq in (6, 8):
        torch.manual_seed(seq)
        x = torch.randn(4, seq, 5)
        y = os.path.join(cr.TMP, "causal_%d.yaml" % seq)
        rc = pe.main([os.path.join(HERE, "attention.py") + ":CausalClassifier", "--kwargs", '{"seq": %d}' % seq,
                      "--input-shape", "%d,5" % seq, "--seed", "5", "-o", y])
        cr.check(rc == 0, "psd-export of minGPT's CausalSelfAttention at T %d, block size 8" % seq)
        with open(y) as f:
            text = f.read()
        cr.check("kind: MaskedFill, mask: triu, diagonal: 1, value: -inf" in text, "psd-export: minGPT's "
                 "masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf')) at T %d is a MaskedFill (triu, "
                 "diagonal 1, -inf)" % seq)
        torch.manual_seed(5)
        model = CausalClassifier(seq=seq)
        with torch.no_grad():
            plain = copy.deepcopy(model)
            plain.attn.bias.fill_(1.0)
            cr.check(not torch.allclose(plain(x), model(x)), "minGPT at T %d: the mask changes the output (the "
                     "test sees it)" % seq)
        label = "minGPT causal attention psd-export, T %d block 8" % seq
        stub, p = cr.start_psd("causal_%d" % seq, "file: %s" % y, ["--init-from", y[:-5] + ".safetensors"])
        cr.input_gradient(label, stub, model, x, target)
        cr.run(label, stub, copy.deepcopy(model), x, target, folded=("attn.bias",))
        p.kill()
        # its training-mode ONNX exports: the mask's Slices of attn.bias folded, Equal, Where(cond, -inf, att)
        # read back as the MaskedFill; at opset 17 with a dynamic batch too
        for opset, dyn in ((13, {}), (17, dict(input_names=["x"], dynamic_axes={"x": {0: "batch"}}))):
            path = os.path.join(cr.TMP, "causal_%d_%d.onnx" % (seq, opset))
            m2 = copy.deepcopy(model).train()
            torch.onnx.export(copy.deepcopy(m2), x, path, training=torch.onnx.TrainingMode.TRAINING,
                              do_constant_folding=False, opset_version=opset, **dyn)
            rc, out = cr.check_config(path)
            cr.check(rc == 0, "minGPT's ONNX export at T %d, opset %d loads (%s)" % (seq, opset,
                                                                                     out.strip()[-200:]))
            label = "minGPT causal attention ONNX opset %d%s, T %d block 8" % (opset, " dynamic" if dyn else "", seq)
            stub, p = cr.start_psd("causal_onnx_%d_%d" % (seq, opset), "onnx: %s" % path, [])
            cr.input_gradient(label, stub, m2, x, target)
            cr.run(label, stub, m2, x, target, folded=("attn.bias",))
            p.kill()
    torch.manual_seed(0)
    x = torch.randn(4, 6, 5)
    for mode in ("mask", "mask_bool"):
        y = os.path.join(cr.TMP, "mha_%s.yaml" % mode)
        rc = pe.main([os.path.join(HERE, "attention.py") + ":MHABlock", "--kwargs", '{"mode": "%s"}' % mode,
                      "--input-shape", "6,5", "--seed", "6", "-o", y])
        cr.check(rc == 0, "psd-export of nn.MultiheadAttention with a causal attn_mask (%s)" % mode)
        with open(y) as f:
            text = f.read()
        cr.check("causal: true" in text, "psd-export: attn_mask=%s is MultiheadAttention's causal: true" % mode)
        torch.manual_seed(6)
        model = MHABlock(mode=mode)
        with torch.no_grad():   # biases and LayerNorms away from their zeros and ones: every gradient shows
            for t in model.parameters():
                t.add_(torch.randn_like(t) * 0.1)
        w = os.path.join(cr.TMP, "mha_%s_moved.safetensors" % mode)
        sd = model.state_dict()
        torch_save_st(w, {k: sd[k] for k in sd if k != "mask"})
        label = "MultiheadAttention causal psd-export (%s)" % mode
        stub, p = cr.start_psd("mha_" + mode, "file: %s" % y, ["--init-from", w])
        cr.input_gradient(label, stub, model, x, target)
        cr.run(label, stub, copy.deepcopy(model), x, target, folded=("mask",))
        p.kill()
    # refusals, naming the mask
    for mode, want in (("mask_other", "its attn_mask (from the buffer mask) is a bool mask other than the causal "
                                      "one"),
                       ("padding", "its key_padding_mask is computed from the input (a per-sample mask")):
        err = run_export([os.path.join(HERE, "attention.py") + ":MHABlock", "--kwargs", '{"mode": "%s"}' % mode,
                          "--input-shape", "6,5", "-o", os.path.join(cr.TMP, "refused.yaml")])
        cr.check(want in err, "psd-export refuses MHABlock %s saying '%s' (%s)" % (mode, want, err.strip()[-300:]))


def run_export(argv):
    """psd-export's stderr for argv (it must fail)."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "psd-export")] + argv, capture_output=True,
                       text=True, timeout=300)
    return r.stderr if r.returncode else "exit 0: " + r.stdout


def torch_save_st(path, tensors):
    """tensors (name -> tensor) as safetensors (psd --init-from)."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from gen_golden import write_safetensors
    write_safetensors(path, tensors, {})


def mha(x, target):
    """nn.MultiheadAttention (attention.py's MHABlock) through its exports: one MultiheadAttention node whose
    parameters are the module's (attn.in_proj_weight, ...), trained one step against PyTorch; what psd refuses
    in it refused by name."""
    for what, mode, opset, kw in (("training export", torch.onnx.TrainingMode.TRAINING, 13, {}),
                                  ("training export, opset 14", torch.onnx.TrainingMode.TRAINING, 14, {}),
                                  # 3 heads: torch 1.13's eval fast path (even heads) fails without biases
                                  ("training export, bias=False, 3 heads", torch.onnx.TrainingMode.TRAINING, 13,
                                   {"bias": False, "n_embd": 12, "n_head": 3}),
                                  # a causal attn_mask (-inf float and bool buffers): causal: true
                                  ("training export, causal float mask", torch.onnx.TrainingMode.TRAINING, 13,
                                   {"mode": "mask"}),
                                  ("training export, causal bool mask", torch.onnx.TrainingMode.TRAINING, 13,
                                   {"mode": "mask_bool"}),
                                  ("eval export", torch.onnx.TrainingMode.EVAL, 13, {})):
        # the eval export folds in_proj_weight^T into onnx::MatMul_N (E, 3E): bound transposed, named by its
        # in_proj_bias
        torch.manual_seed(4)
        model = MHABlock(**kw)
        with torch.no_grad():   # biases and LayerNorms away from their zeros and ones: every gradient shows, and
            for t in model.parameters():   # the eval export (which dedups equal initializers into Identity)
                t.add_(torch.randn_like(t) * 0.1)   # keeps each
        path = os.path.join(cr.TMP, "mha_%s.onnx" % what.replace(" ", "_").replace(",", "").replace("=", ""))
        m = copy.deepcopy(model).train()
        torch.onnx.export(copy.deepcopy(m) if mode == torch.onnx.TrainingMode.TRAINING else copy.deepcopy(m).eval(),
                          x, path, training=mode, do_constant_folding=mode == torch.onnx.TrainingMode.EVAL,
                          opset_version=opset)
        stub, p = cr.start_psd(os.path.basename(path)[:-5], "onnx: %s" % path, [])
        names = sorted(t.name for t in stub.ListParameters(ps_pb2.ListParametersRequest()).parameters)
        cr.check("attn.in_proj_weight" in names and not any(n.startswith("attn.") and "proj" not in n for n in names),
                 "MultiheadAttention %s: one node, attn's parameters under the module's names (%s)" % (what, names))
        cr.input_gradient("MultiheadAttention " + what, stub, m, x, target)
        cr.run("MultiheadAttention " + what, stub, m, x, target, folded=("mask",) if "mask" in kw.get("mode", "")
               else ())
        p.kill()
    # dropout on the attention weights is the kind's own (psd draws its masks): the import carries p
    path = os.path.join(cr.TMP, "mha_dropout.onnx")
    torch.onnx.export(MHABlock(dropout=0.25).train(), x, path, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, opset_version=13)
    stub, p = cr.start_psd("mha_dropout", "onnx: %s" % path, [])
    ctx = random.randint(1, 1 << 60)
    a = cr.array(stub.Forward(ps_pb2.ForwardRequest(input=cr.tensor(x.numpy()), train=False), timeout=60).output)
    b = cr.array(stub.Forward(ps_pb2.ForwardRequest(context_id=ctx, seq=0, train=True, trainer_rank=1,
                                                    input=cr.tensor(x.numpy())), timeout=60).output)
    cr.check(not np.allclose(a, b), "MultiheadAttention with dropout 0.25: a training forward drops (differs from "
             "the eval one)")
    p.kill()
    for mode, want in (("mask_other", "the attention mask '/attn/Mul_4_output_0' is not the causal one: element "
                                      "(0, 1) is 0"),
                       ("cross", "cross-attention"), ("weights", "need_weights=True"),
                       ("dynamic", "a dynamic batch")):
        path = os.path.join(cr.TMP, "mha_%s.onnx" % mode)
        dyn = dict(input_names=["x"], dynamic_axes={"x": {0: "batch"}}) if mode == "dynamic" else {}
        torch.onnx.export(MHABlock(mode="plain" if mode == "dynamic" else mode).train(), x, path,
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                          opset_version=17 if mode == "dynamic" else 13, **dyn)
        rc, out = cr.check_config(path)
        at = "node '/attn/Add_2' (Add)" if mode == "mask_other" else "node '/attn/Transpose' (Transpose)"
        cr.check(rc != 0 and at + ": nn.MultiheadAttention:" in out and want in out,
                 "MultiheadAttention %s: refused at %s, saying '%s' (%s)"
                 % (mode, at, want, out.strip().splitlines()[-1] if out.strip() else "no output"))


if __name__ == "__main__":
    cr.run_main(main)
