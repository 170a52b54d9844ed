#!/usr/bin/python3
"""tests/it_rnn.sh's Python half: nn.LSTM and nn.GRU run by psd inside a
user's graph (tests/export/rnn.py) through psd-export, against PyTorch:

  TextRNN  token ids -> nn.Embedding -> nn.LSTM / nn.GRU (batch_first=True)
           -> the last step -> nn.Linear: an LSTM read as out[:, -1]; a
           2-layer LSTM read as h[-1] of out, (h, c) = lstm(x); a GRU read
           as h[-1] of out, h = gru(x); a 2-layer GRU without bias read as
           out[:, -1, :]; an LSTM read as h_n[-1] of _, (h_n, _) = lstm(x);
  SeqRNN   features (N, T, F) -> a 2-layer nn.GRU / nn.LSTM -> nn.Linear of
           the flattened output sequence, its input gradient too;
  bidirectional (both directions of each layer feeding the next): a 2-layer
           LSTM read as torch.cat((h_n[-2], h_n[-1]), dim=1), a GRU read as
           h = h_n[-2:]; torch.cat((h[0], h[1]), 1), a 3-layer GRU without
           bias read as h[-1] (the reverse direction's), a 4-layer GRU read
           as out[:, -1] (both directions), a 2-layer LSTM over features.

Every parameter is moved off its initial value, psd started with
--init-from those values, and each model checked by check_resnet.py's run()
with ref64: psd's initial parameters named as the state_dict
(rnn.weight_ih_l0, rnn.bias_hh_l1, ...) and valued as it, the eval and
training forwards, every parameter gradient of one backward against
float64 autograd (within 8x PyTorch float32's own error or 1e-4 of the
tensor's largest), the step, psd's tensors loading into the module with
load_state_dict(strict=True). Then psd trains each text model 60 steps on a
fixed batch (Forward, Backward, Step; cross-entropy summed over the batch,
computed here): the loss falls below 0.8 of its first value, each step's
within 1e-5 of PyTorch's own SGD loop's on the module. A 2-layer LSTM with dropout 0.3: its
training forward differs from the eval one (psd drops between layers), the
eval forward is PyTorch's. ps-train fit trains an exported GRU text
classifier through psd (Adam) on .npy files whose label is the first of 6
tokens mod 4 - read at the last step, so only the recurrence carries it
(chance: 25 %) - to at least 90 % test accuracy. And refusals naming what: batch_first=False,
an LSTM's c_n read, h_n[0] of a 2-layer RNN (one direction or two). Then
ONNX: 9 of the models (one direction and both, 1 to 4 layers, with and
without bias, each reader) exported by torch.onnx in training mode (W, R, B
glued from PyTorch's tensors) and in eval mode (folded initializers in ONNX's
gate order), imported by psd as one LSTM / GRU node under the state_dict's
names and checked as above against float64 autograd; the ONNX import's
refusals of a c_n read, a lower layer's h_n row and an initial state.

    check_rnn.py BUILD_DIR TMP_DIR
"""
import copy
import json
import os
import random
import subprocess
import sys
import warnings

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import check_resnet as cr  # noqa: E402 (reads BUILD_DIR TMP_DIR from sys.argv, as this script takes them)
from rnn import SeqRNN, TextRNN  # noqa: E402
from psd._proto import ps_pb2  # noqa: E402  (check_resnet put python/ on the path)


SEQ, VOCAB, BATCH = 6, 20, 8

CASES = [
    # (label, class, kwargs)
    ("LSTM, out[:, -1]", TextRNN, {}),
    ("2-layer LSTM, h[-1] of out, (h, c)", TextRNN, {"num_layers": 2, "read": "h"}),
    ("GRU, h[-1] of out, h", TextRNN, {"cell": "GRU", "read": "h"}),
    ("2-layer GRU without bias, out[:, -1, :]", TextRNN, {"cell": "GRU", "num_layers": 2, "bias": False,
                                                          "read": "out3"}),
    ("LSTM, h_n[-1] of _, (h_n, _)", TextRNN, {"read": "h_n", "hidden": 7}),
    ("2-layer GRU over features, the whole sequence", SeqRNN, {}),
    ("2-layer LSTM over features, the whole sequence", SeqRNN, {"cell": "LSTM"}),
    # bidirectional: h_n (num_layers * 2, N, H), the last layer's rows h_n[-2] (forward) and h_n[-1] (reverse)
    ("bidirectional 2-layer LSTM, torch.cat((h_n[-2], h_n[-1]), dim=1)", TextRNN,
     {"bidirectional": True, "num_layers": 2, "read": "cat"}),
    ("bidirectional GRU, h = h_n[-2:]; torch.cat((h[0], h[1]), 1)", TextRNN,
     {"bidirectional": True, "cell": "GRU", "read": "slice", "hidden": 9}),
    ("bidirectional 3-layer GRU without bias, h[-1] (the reverse direction's) of out, h", TextRNN,
     {"bidirectional": True, "cell": "GRU", "num_layers": 3, "bias": False, "read": "h"}),
    ("bidirectional 4-layer GRU, out[:, -1] (both directions)", TextRNN,
     {"bidirectional": True, "cell": "GRU", "num_layers": 4, "hidden": 16}),
    ("bidirectional 2-layer LSTM over features, the whole sequence", SeqRNN, {"cell": "LSTM", "bidirectional": True}),
]


def shape_args(cls):
    return ["--input-shape", str(SEQ), "--input-dtype", "int64"] if cls is TextRNN else \
        ["--input-shape", "%d,5" % SEQ]


def export(pe, cls, kwargs, name, seed=7):
    y = os.path.join(cr.TMP, name + ".yaml")
    rc = pe.main([os.path.join(HERE, "rnn.py") + ":" + cls.__name__, "--kwargs", json.dumps(kwargs),
                  "--seed", str(seed), "-o", y] + shape_args(cls))
    with open(y) if rc == 0 else open(os.devnull) as f:
        return rc, y, f.read()


def inputs(cls, seed):
    torch.manual_seed(seed)
    x = torch.randint(0, VOCAB, (BATCH, SEQ)) if cls is TextRNN else torch.randn(BATCH, SEQ, 5)
    return x, torch.randint(0, 4, (BATCH,))


def moved(cls, kw, name):
    return cr.moved(lambda: cls(**kw), name)


def checked(label, name, y, w, model, x, target, input_grad=False, steps=60, after=None):
    """psd started on model file y with --init-from w: the input gradient (input_grad), check_resnet's run() with
    ref64 on a copy of model (stepped as psd's first step), then steps (0: none) SGD steps of train_steps, then
    after(stub) for a script's own checks of the trained psd."""
    stub, p = cr.start_psd(name, "file: %s" % y, ["--init-from", w])
    if input_grad:
        cr.input_gradient(label, stub, model, x, target)
    stepped = copy.deepcopy(model)      # run() steps it as psd's first step
    cr.run(label, stub, stepped, x, target, ref64=True)
    if steps:
        train_steps(label, stub, x, target, stepped, steps=steps)
    if after is not None:
        after(stub)
    p.kill()


def train_steps(label, stub, x, target, model=None, steps=60):
    """psd trains on one fixed batch (cross-entropy summed over the batch, computed here from psd's outputs;
    psd's SGD at check_resnet's lr 0.01): the loss falls below 0.8 of its first value, and with model (no
    dropout) every step's loss is PyTorch's own SGD loop's on the module within 1e-5 of it."""
    losses, want = [], []
    if model is not None:
        model = copy.deepcopy(model).train()
        opt = torch.optim.SGD(model.parameters(), lr=cr.LR)
    for s in range(steps):
        ctx = random.randint(1, 1 << 60)
        r = stub.Forward(ps_pb2.ForwardRequest(context_id=ctx, seq=0, train=True, trainer_rank=1,
                                               input=cr.tensor(x.numpy())), timeout=60)
        y = torch.from_numpy(cr.array(r.output).copy()).requires_grad_(True)
        loss = F.cross_entropy(y, target, reduction="sum")
        gy = torch.autograd.grad(loss, y)[0]
        stub.Backward(ps_pb2.BackwardRequest(context_id=ctx, seq=0, grad_output=cr.tensor(gy.numpy())), timeout=60)
        stub.Step(ps_pb2.StepRequest(context_id=ctx), timeout=60)
        losses.append(float(loss) / len(target))
        if model is not None:
            opt.zero_grad()
            lt = F.cross_entropy(model(x), target, reduction="sum")
            lt.backward()
            opt.step()
            want.append(float(lt) / len(target))
    cr.check(losses[-1] < 0.8 * losses[0] and all(np.isfinite(losses)),
             "%s: %d steps through psd on one batch: the loss falls from %.4f to %.4f" % (label, steps, losses[0],
                                                                                         losses[-1]))
    if model is not None:
        e = max(abs(a - b) / abs(b) for a, b in zip(losses, want))
        cr.check(e <= 1e-5, "%s: each of the %d steps' loss within 1e-5 of PyTorch's SGD loop's (worst %.3g; "
                 "PyTorch's last %.4f)" % (label, steps, e, want[-1]))


def main():
    pe = cr.load_psd_export()
    for i, (label, cls, kw) in enumerate(CASES):
        name = "rnn_%d" % i
        rc, y, text = export(pe, cls, kw, name)
        cr.check(rc == 0, "psd-export of %s" % label)
        if rc:
            continue
        kind = kw.get("cell", "GRU" if cls is SeqRNN else "LSTM")
        cr.check("kind: %s" % kind in text and "--trainer-side" not in text,
                 "%s: the model file runs it as psd's %s node" % (label, kind))
        model, w = moved(cls, kw, name)
        x, target = inputs(cls, i)
        checked(label, name, y, w, model, x, target, input_grad=cls is SeqRNN, steps=60 if cls is TextRNN else 0)
    dropout(pe)
    fit(pe)
    refusals()
    onnx_models()
    onnx_refusals()


def dropout(pe):
    """A 2-layer LSTM with dropout 0.3 between its layers: written as the node's dropout; psd's eval forward is
    PyTorch's, a training forward drops (it differs from the eval one) and trains."""
    kw = {"num_layers": 2, "dropout": 0.3}
    rc, y, text = export(pe, TextRNN, kw, "rnn_dropout")
    cr.check(rc == 0 and "dropout: 0.3" in text, "2-layer LSTM with dropout: the node's dropout: 0.3")
    if rc:
        return
    model, w = moved(TextRNN, kw, "rnn_dropout")
    x, target = inputs(TextRNN, 99)
    stub, p = cr.start_psd("rnn_dropout", "file: %s" % y, ["--init-from", w])
    with torch.no_grad():
        want = model.eval()(x).numpy()
    ev = cr.array(stub.Forward(ps_pb2.ForwardRequest(input=cr.tensor(x.numpy()), train=False), timeout=60).output)
    cr.close(ev, want, 1e-4, 1e-5, "2-layer LSTM with dropout: eval forward = PyTorch's eval mode")
    ctx = random.randint(1, 1 << 60)
    tr = cr.array(stub.Forward(ps_pb2.ForwardRequest(context_id=ctx, seq=0, train=True, trainer_rank=1,
                                                     input=cr.tensor(x.numpy())), timeout=60).output)
    cr.check(not np.allclose(tr, ev, 1e-4, 1e-5), "2-layer LSTM with dropout: a training forward drops between "
             "the layers (differs from the eval one by %.3g)" % float(np.max(np.abs(tr - ev))))
    stub.ReleaseContext(ps_pb2.ReleaseContextRequest(context_id=ctx), timeout=60)
    train_steps("2-layer LSTM with dropout", stub, x, target)
    p.kill()


def fit_accuracy(name, y, files, epochs, what):
    """ps-train fit (Adam, lr 0.01, cross_entropy, batch 32, seed 3) of model file y through a psd of its own, on
    files {"train": (inputs, labels), "test": (inputs, labels)} (.npy): the run ends and the test accuracy is at
    least 90 % (what: the check's words)."""
    addr, cfg, p = cr.fit_psd(name, y, "type: adam\n  lr: 0.01")
    r = subprocess.run([os.path.join(cr.BUILD, "bin", "ps-train"), "fit", "--config", cfg, "--server", addr,
                        "--world-size", "2", "--inputs", files["train"][0], "--labels", files["train"][1],
                        "--test-inputs", files["test"][0], "--test-labels", files["test"][1], "--loss",
                        "cross_entropy", "--batch-size", "32", "--epochs", str(epochs), "--seed", "3", "--wait-s",
                        "60", "--log-every", "1000"], capture_output=True, text=True, timeout=300)
    p.kill()
    acc = [ln for ln in r.stdout.splitlines() if " test loss " in ln]
    got = float(acc[-1].split("accuracy ")[1].split("%")[0]) if acc else -1.0
    cr.check(r.returncode == 0 and got >= 90.0, "ps-train fit: %s: %s (exit %d%s)"
             % (what, acc[-1] if acc else "no test line", r.returncode,
                "" if acc else ": " + (r.stdout + r.stderr)[-400:]))


def fit(pe):
    """ps-train fit trains an exported GRU text classifier through psd on .npy files whose label is the first
    token's id mod 4 (read at the last step: the answer crosses every step of the recurrence): test accuracy
    from chance (25 %) to at least 90 %."""
    kw = {"cell": "GRU", "hidden": 16, "classes": 4}
    rc, y, _ = export(pe, TextRNN, kw, "rnn_fit")
    cr.check(rc == 0, "psd-export of the GRU text classifier for ps-train fit")
    if rc:
        return
    g = np.random.default_rng(5)
    files = {}
    for part, n in (("train", 4000), ("test", 500)):
        ids = g.integers(0, VOCAB, (n, SEQ), dtype=np.int64)
        files[part] = (os.path.join(cr.TMP, "fit_%s_x.npy" % part), os.path.join(cr.TMP, "fit_%s_y.npy" % part))
        np.save(files[part][0], ids)
        np.save(files[part][1], (ids[:, 0] % 4).astype(np.int64))
    fit_accuracy("rnn_fit", y, files, 8, "the GRU text classifier through psd, the label the first of 6 tokens "
                 "mod 4")


def refusals():
    for kw, want in (
            ({"batch_first": False}, "batch_first=False: psd's batch is the first dimension"),
            ({"bidirectional": True, "read": "h0", "num_layers": 2},
             "h_n[0] of 'rnn' (LSTM, 2 layers, bidirectional) at"),
            ({"read": "c"}, "c_n of 'rnn' (LSTM) is read at"),
            ({"read": "h0", "num_layers": 2}, "h_n[0] of 'rnn' (LSTM, 2 layers)"),
            ({"read": "h0", "num_layers": 2, "cell": "GRU"}, "h_n[0] of 'rnn' (GRU, 2 layers)")):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "psd-export"),
                            os.path.join(HERE, "rnn.py") + ":TextRNN", "--kwargs", json.dumps(kw),
                            "-o", os.path.join(cr.TMP, "refused.yaml")] + shape_args(TextRNN),
                           capture_output=True, text=True, timeout=300)
        cr.check(r.returncode != 0 and want in r.stderr, "psd-export refuses %s saying '%s' (%s)"
                 % (json.dumps(kw), want, (r.stderr or r.stdout).strip()[-300:]))


ONNX_CASES = [
    # (label, class, kwargs): exported by torch.onnx in training mode (W, R, B glued from PyTorch's tensors) and
    # in eval mode (constant-folded into initializers in ONNX's gate order)
    ("LSTM, out[:, -1]", TextRNN, {}),
    ("2-layer GRU, h[-1] of out, h", TextRNN, {"cell": "GRU", "num_layers": 2, "read": "h"}),
    ("2-layer LSTM without bias, h_n[-1]", TextRNN, {"num_layers": 2, "bias": False, "read": "h_n", "hidden": 7}),
    ("bidirectional 2-layer LSTM, torch.cat((h_n[-2], h_n[-1]), dim=1)", TextRNN,
     {"bidirectional": True, "num_layers": 2, "read": "cat"}),
    ("bidirectional GRU without bias, h = h_n[-2:]; torch.cat((h[0], h[1]), 1)", TextRNN,
     {"bidirectional": True, "cell": "GRU", "bias": False, "read": "slice", "hidden": 9}),
    ("bidirectional 3-layer GRU, out[:, -1] (both directions)", TextRNN,
     {"bidirectional": True, "cell": "GRU", "num_layers": 3}),
    ("bidirectional 4-layer LSTM, h[-1] (the reverse direction's)", TextRNN,
     {"bidirectional": True, "num_layers": 4, "read": "h", "hidden": 5}),
    ("2-layer LSTM over features, the whole sequence", SeqRNN, {"cell": "LSTM"}),
    ("bidirectional 2-layer GRU over features, the whole sequence", SeqRNN, {"bidirectional": True}),
]


DYNAMIC = (0, 3, 8)   # ONNX_CASES also exported with a dynamic batch


def onnx_export(model, x, path, mode):
    """mode "training", "eval", or "dynamic": training mode with a dynamic batch (dynamic_axes), whose initial
    states are a ConstantOfShape of zeros to (layers, N, H) rather than an Expand of constant zeros."""
    tm = torch.onnx.TrainingMode.EVAL if mode == "eval" else torch.onnx.TrainingMode.TRAINING
    dyn = dict(input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "N"}, "y": {0: "N"}}) \
        if mode == "dynamic" else {}
    with warnings.catch_warnings():   # the exporter's note on batch sizes and the RNN's initial state
        warnings.simplefilter("ignore")
        torch.onnx.export(copy.deepcopy(model).train(mode != "eval"), x, path, opset_version=13, training=tm,
                          do_constant_folding=mode == "eval", **dyn)


def onnx_models():
    """The models' ONNX exports (training and eval mode; some with a dynamic batch too) through psd's ONNX import:
    one LSTM / GRU node with the state_dict's names and values (every parameter moved off its initial value),
    checked as the psd-export models are against float64 autograd (the sequence models' input gradient too)."""
    for i, (label, cls, kw) in enumerate(ONNX_CASES):
        for mode in ("training", "eval") + (("dynamic",) if i in DYNAMIC else ()):
            name = "rnn_onnx_%d_%s" % (i, mode)
            model, _ = moved(cls, kw, name)
            x, target = inputs(cls, 40 + i)
            path = os.path.join(cr.TMP, name + ".onnx")
            onnx_export(model, x, path, mode)
            lab = "%s, ONNX %s export" % (label, mode)
            stub, p = cr.start_psd(name, "onnx: %s" % path, [])
            if cls is SeqRNN:
                cr.input_gradient(lab, stub, model, x, target)
            cr.run(lab, stub, copy.deepcopy(model), x, target, ref64=True)
            p.kill()


def onnx_refusals():
    """What psd's ONNX import of an LSTM / GRU still refuses, naming it: an LSTM's c_n read, a lower layer's h_n
    row, an initial state of ones (one of zeros, x.new_zeros(...), is the exporter's zeros: taken)."""
    for kw, want in (
            ({"read": "c"}, "is the final cell state of an LSTM or GRU psd computes as one node"),
            ({"read": "h0", "num_layers": 2, "cell": "GRU"}, "row 0 of h_n: layer 0's final state"),
            ({"read": "h0", "num_layers": 2, "bidirectional": True}, "row 0 of h_n: layer 0's final state"),
            ({"read": "hx1"}, "an initial hidden state psd does not read as the exporter's zeros")):
        path = os.path.join(cr.TMP, "rnn_refused.onnx")
        torch.manual_seed(3)
        onnx_export(TextRNN(**kw), inputs(TextRNN, 0)[0], path, "training")
        rc, out = cr.check_config(path)
        cr.check(rc != 0 and want in out, "ONNX import refuses %s saying '%s' (%s)" % (json.dumps(kw), want,
                                                                                     out.strip()[-300:]))


if __name__ == "__main__":
    cr.run_main(main)
