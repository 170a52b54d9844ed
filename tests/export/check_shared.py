#!/usr/bin/python3
"""tests/it_shared.sh's Python half: modules whose parameters are used at
several sites (tests/export/shared.py) through psd-export and psd, against
PyTorch (docs/models.md "Shared parameters"):

  Siamese   one encoder (Conv2d, ReLU, Flatten, Linear) applied to both
            images of a sample: psd-export writes `share:` for the second
            call's Conv2d and Linear;
  Repeated  an ALBERT-style block (Linear, LayerNorm, Tanh) applied three
            times and one MultiheadAttention twice: `share:` at every later
            site;
  TiedLM    self.decoder.weight = self.encoder.weight (an Embedding's (V, E)
            table as the decoder Linear's weight): `tie: {weight:
            encoder.weight}`.

Every parameter moved off its initial value and psd started with
--init-from the module's state_dict (the tied model's holds both keys, one
value), then check_resnet.py's run() with ref64: psd's parameters named and
valued as the state_dict (a shared module's once; a tied weight under its
owner), the eval and training forwards, every parameter gradient of one
backward against float64 autograd (PyTorch sums a shared parameter's
gradient over its sites; psd must too), the step, psd's tensors loading
with load_state_dict(strict=True); the input gradient of the float models.
Then psd's checkpoint after that step: the tied model's file holds both
keys with one value, every tensor equals psd's, the file loads into the
module with load_state_dict(strict=True) and gives psd's eval forward, and
a psd restarted from the checkpoint directory resumes those values. The
same through each module's training-mode ONNX export (the block without
its attention): an initializer several nodes read is one parameter. And
psd-export's refusals: a module with buffers other than BatchNorm's called
twice (a Linear given a buffer of its own; a BatchNorm called twice is
tests/it_sharebn.sh's), two sites of one module cut into
different stages.

    check_shared.py BUILD_DIR TMP_DIR
"""
import copy
import glob
import json
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import check_resnet as cr  # noqa: E402 (reads BUILD_DIR TMP_DIR from sys.argv, as this script takes them)
from psd._proto import ps_pb2  # noqa: E402  (check_resnet put python/ on the path)
from psd.checkpoint import read_safetensors  # noqa: E402
from shared import Repeated, Siamese, TiedLM  # noqa: E402


BATCH = 6
CASES = [
    # (label, class, kwargs, psd-export's shape arguments, lines the model file must hold, tied {alias: owner})
    ("siamese encoder", Siamese, {}, ["--input-shape", "2,6,6"],
     ["name: encoder.0_1, kind: Conv2d", "share: encoder.0}", "share: encoder.3}"], {}),
    ("block applied three times, attention twice", Repeated, {}, ["--input-shape", "5,8"],
     ["share: block.0}", "share: block.1}", "share: attn}"], {}),
    ("tied embedding and decoder", TiedLM, {}, ["--input-shape", "4", "--input-dtype", "int64"],
     ["tie: {weight: encoder.weight}"], {"decoder.weight": "encoder.weight"}),
]


def export(pe, cls, kwargs, shape, name, extra=()):
    y = os.path.join(cr.TMP, name + ".yaml")
    rc = pe.main([os.path.join(HERE, "shared.py") + ":" + cls.__name__, "--kwargs", json.dumps(kwargs),
                  "--seed", "7", "-o", y] + shape + list(extra))
    with open(y) if rc == 0 else open(os.devnull) as f:
        return rc, y, f.read()


def moved(cls, kw, name):
    return cr.moved(lambda: cls(**kw), name)   # a tied tensor is one parameter: it moves once


def inputs(cls, seed):
    torch.manual_seed(seed)
    if cls is TiedLM:
        return torch.randint(0, 20, (BATCH, 4)), torch.randint(0, 80, (BATCH,))
    x = torch.randn(BATCH, 2, 6, 6) if cls is Siamese else torch.randn(BATCH, 5, 8)
    return x, torch.randint(0, 3, (BATCH,))


def newest_ckpt(d, timeout=60):
    t0 = time.time()
    while time.time() - t0 < timeout:
        files = sorted(f for f in glob.glob(os.path.join(d, "ckpt-*.safetensors")) if ".optim." not in f)
        if files:
            return files[-1]
        time.sleep(0.2)
    return None


def checkpoint(label, name, y, stub, p, model, x, tied, ckdir):
    """psd's checkpoint after run()'s step: both keys of a tie, psd's values, a strict load into the module
    whose eval forward is psd's, and a psd restarted from it resuming them."""
    after = cr.get_parameters(stub)
    path = newest_ckpt(ckdir)
    cr.check(path is not None, "%s: psd wrote a checkpoint after the step (%s)" % (label, ckdir))
    if path is None:
        return
    time.sleep(0.5)   # written by rename: complete once listed
    ck, meta = read_safetensors(path)
    want = set(model.state_dict())
    cr.check(set(ck) == want, "%s: the checkpoint holds the state_dict's %d keys (%s)"
             % (label, len(want), sorted(set(ck) ^ want)[:4]))
    bad = [k for k in after if k not in ck or not np.array_equal(ck[k].numpy().reshape(-1), after[k].reshape(-1))]
    bad += [a for a, o in tied.items() if a not in ck or o not in ck or not torch.equal(ck[a], ck[o])]
    cr.check(not bad, "%s: every checkpoint tensor is psd's value%s (%s)"
             % (label, ", a tied key its owner's" if tied else "", bad[:4]))
    loaded, err = cr.strict_load(label, model, ck)
    if tied and not err:
        cr.check(all(loaded.get_parameter(a) is loaded.get_parameter(o) for a, o in tied.items()),
                 "%s: after the strict load the module's weights are still tied" % label)
    loaded.eval()
    with torch.no_grad():
        want_y = loaded(x).numpy()
    r = stub.Forward(ps_pb2.ForwardRequest(input=cr.tensor(x.numpy()), train=False), timeout=60)
    cr.close(cr.array(r.output), want_y, 1e-4, 1e-5, "%s: the loaded module's eval forward = psd's" % label)
    p.kill()
    p.wait()
    stub2, p2 = cr.start_psd(name + "_resumed", "file: %s" % y, [], "  checkpoint_dir: %s\n" % ckdir)
    again = cr.get_parameters(stub2)
    bad = [k for k in after if k not in again or not np.array_equal(again[k], after[k])]
    cr.check(set(again) == set(after) and not bad, "%s: psd restarted from the checkpoint (%s) resumes every "
             "parameter (%s)" % (label, os.path.basename(path), bad[:4] or sorted(set(again) ^ set(after))[:4]))
    p2.kill()


def main():
    pe = cr.load_psd_export()
    for i, (label, cls, kw, shape, lines, tied) in enumerate(CASES):
        name = "shared_%d" % i
        rc, y, text = export(pe, cls, kw, shape, name)
        cr.check(rc == 0, "psd-export of %s" % label)
        if rc:
            continue
        missing = [ln for ln in lines if ln not in text]
        cr.check(not missing, "%s: the model file holds %s (missing %s)" % (label, lines, missing))
        model, w = moved(cls, kw, name)
        x, target = inputs(cls, i)
        ckdir = os.path.join(cr.TMP, name + "_ckpt")
        stub, p = cr.start_psd(name, "file: %s" % y, ["--init-from", w],
                               "  checkpoint_dir: %s\n  checkpoint_every_steps: 1\n" % ckdir)
        if cls is not TiedLM:
            cr.input_gradient(label, stub, model, x, target)
        stepped = copy.deepcopy(model)      # run() steps it as psd's first step
        cr.run(label, stub, stepped, x, target, ref64=True, tied=tied)
        checkpoint(label, name, y, stub, p, stepped, x, tied, ckdir)
        onnx(label, name, cls, x, target, tied)
    refusals()


def onnx(label, name, cls, x, target, tied):
    """The module's training-mode ONNX export (opset 13): an initializer read by several nodes (directly or
    through a Transpose) is one parameter of psd's (share: where a whole node's are, tie: otherwise), named as
    the state_dict; run() as for psd-export's file. The attention applied twice is left out (psd's ONNX import
    matches one attention pattern per module, so ALBERT's attention exports through psd-export only)."""
    kw = {"attention": False} if cls is Repeated else {}
    model, _ = moved(cls, kw, name + "_onnx")
    path = os.path.join(cr.TMP, name + "_train.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(copy.deepcopy(model).train(), x, path, training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, opset_version=13)
    rc, out = cr.check_config(path)
    want = ["shared: %s is %s (tie" % (a, o) for a, o in tied.items()] if tied else ["(share, stage main)"]
    cr.check(rc == 0 and all(w in out for w in want), "%s onnx: psd --check-config lists the shared parameters "
             "(%s): %s" % (label, want, out.strip()[-400:]))
    stub, p = cr.start_psd(name + "_onnx", "onnx: %s" % path, [])
    cr.run("%s onnx training export" % label.split(",")[0], stub, model, x, target, ref64=True, tied=tied)
    p.kill()


def refusals():
    src = os.path.join(cr.TMP, "buffer_twice.py")
    with open(src, "w") as f:
        f.write("import torch\nimport torch.nn as nn\n\n\nclass BufferTwice(nn.Module):\n"
                "    def __init__(self):\n        super().__init__()\n        self.lin = nn.Linear(4, 4)\n"
                "        self.lin.register_buffer('scale', torch.ones(4))\n\n"
                "    def forward(self, x):\n        return self.lin(self.lin(x))\n")
    for args, want in (
            ([src + ":BufferTwice", "--input-shape", "4"],
             "module 'lin' (Linear) is called at several sites (again at"),
            ([os.path.join(HERE, "shared.py") + ":Repeated", "--input-shape", "5,8", "--stage", "a=inp:add_1",
              "--stage", "b=block.0_1:out"],
             "node 'block.0_1' (stage 'b') uses the parameters of 'block.0' (stage 'a', share): psd shares "
             "parameters within a stage")):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "psd-export")] + args +
                           ["-o", os.path.join(cr.TMP, "refused.yaml")], capture_output=True, text=True, timeout=300)
        cr.check(r.returncode != 0 and want in r.stderr, "psd-export refuses %s saying '%s' (%s)"
                 % (" ".join(args[1:]), want, (r.stderr or r.stdout).strip()[-300:]))


if __name__ == "__main__":
    cr.run_main(main)
