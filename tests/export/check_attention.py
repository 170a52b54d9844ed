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
import sys

import importlib.machinery
import importlib.util

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import check_resnet as cr  # noqa: E402 (reads BUILD_DIR TMP_DIR from sys.argv, as this script takes them)
from attention import AttentionClassifier  # noqa: E402
from psd._proto import ps_pb2  # noqa: E402  (check_resnet put python/ on the path)

SHAPE = (6, 5)          # tokens, features per token


def input_gradient(label, stub, model, x, target):
    """d loss / d input of one training Forward + Backward against PyTorch autograd's (within 1e-4 of its
    largest |value|): the gradient a stage before this one would receive."""
    model = copy.deepcopy(model).train()
    xr = x.clone().requires_grad_(True)
    y = model(xr)
    gy = torch.autograd.grad(F.cross_entropy(y, target), y, retain_graph=True)[0]
    y.backward(gy)
    ctx = random.randint(1, 1 << 60)
    stub.Forward(ps_pb2.ForwardRequest(context_id=ctx, seq=0, train=True, trainer_rank=1, input=cr.tensor(x.numpy())),
                 timeout=60)
    r = stub.Backward(ps_pb2.BackwardRequest(context_id=ctx, seq=0, grad_output=cr.tensor(gy.numpy()),
                                             want_input_grad=True), timeout=60)
    got, want = cr.array(r.input_grads[0]).reshape(x.shape), xr.grad.numpy()
    e = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))
    cr.check(e <= 1e-4, "%s: the input gradient within 1e-4 of its largest |value| of PyTorch's (%.3g)" % (label, e))


def main():
    loader = importlib.machinery.SourceFileLoader("psd_export", os.path.join(ROOT, "tools", "psd-export"))
    spec = importlib.util.spec_from_loader("psd_export", loader)
    pe = importlib.util.module_from_spec(spec)
    loader.exec_module(pe)
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
    input_gradient("attention psd-export", stub, model, x, target)
    cr.run("attention psd-export", stub, copy.deepcopy(model), x, target)
    p.kill()

    # 2. the training-mode ONNX export
    path = os.path.join(cr.TMP, "attention_train.onnx")
    m2 = copy.deepcopy(model).train()
    torch.onnx.export(m2, x, path, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      opset_version=13)
    stub, p = cr.start_psd("attention_onnx", "onnx: %s" % path, [])
    input_gradient("attention onnx training export", stub, m2, x, target)
    cr.run("attention onnx training export", stub, m2, x, target)
    p.kill()

    # 3. the same with a dynamic batch at opset 17: the view's sizes are Shape, Gather, Unsqueeze and Concat of
    # the input's shape (the batch symbolic), folded to the Reshapes' shapes; LayerNormalization is one op
    path = os.path.join(cr.TMP, "attention_dyn.onnx")
    m3 = copy.deepcopy(model).train()
    torch.onnx.export(m3, x, path, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      opset_version=17, input_names=["x"], dynamic_axes={"x": {0: "batch"}})
    stub, p = cr.start_psd("attention_dyn", "onnx: %s" % path, [])
    input_gradient("attention onnx export, dynamic batch", stub, m3, x, target)
    cr.run("attention onnx export, dynamic batch", stub, m3, x, target)
    p.kill()


if __name__ == "__main__":
    try:
        main()
    finally:
        for p in cr.procs:
            if p.poll() is None:
                p.kill()
    sys.exit(1 if cr.failures else 0)
