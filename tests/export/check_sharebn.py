#!/usr/bin/python3
"""tests/it_sharebn.sh's Python half: modules with BatchNorm called at
several sites (tests/export/sharebn.py: a SimCLR-style siamese CNN, a
triplet network whose encoder's BatchNorm1d has affine=False and
momentum=None, a recurrent-depth block applied three times) through
psd-export and psd, against PyTorch (docs/models.md "Shared parameters"):

  - the model file holds `share:` for every later call of a BatchNorm,
    psd --check-config says which share parameters and buffers, and
    ListParameters lists the state_dict's names once each;
  - every parameter moved off its initial value and the running statistics
    off their defaults, psd started with --init-from the module's
    state_dict, then check_resnet.py's run() with ref64: psd's parameters
    and buffers are the state_dict's names (each BatchNorm's buffers once,
    under its first call's names), its values exactly, eval and training
    forwards, every parameter gradient against float64 autograd (summed
    over the sites), the step: the running statistics PyTorch's after its
    training forward (each call's batch statistics, momentum applied once
    per call in call order) and num_batches_tracked equal, a strict load;
  - then STEPS more SGD steps on fresh batches through psd beside
    PyTorch's own loop (torch.optim.SGD): at each, psd's training output
    and every gradient within 1e-4 of PyTorch's (relative to the tensor's
    largest; a Linear bias before a training BatchNorm, whose gradient is 0
    but for rounding: psd's error against float64 autograd within 8x
    PyTorch float32's), and after it every parameter and running statistic within
    1e-4 of PyTorch's loop, num_batches_tracked equal (sites x steps);
  - psd's checkpoint after the last step: the state_dict's keys exactly
    (the buffers once), every tensor psd's, loading into the module with
    load_state_dict(strict=True) with its buffers equal to psd's, and
    evaluating (eval mode: the shared running statistics at every site)
    to psd's eval forward and to PyTorch's loop's within 1e-4; a psd
    restarted from the checkpoint resumes every parameter and buffer.

The siamese and recurrent-depth modules' training-mode ONNX exports
through psd's ONNX import the same way (run() and the loop): the
BatchNormalization nodes of one module read the same initializers, one
node of psd's with share: at the others.

    check_sharebn.py BUILD_DIR TMP_DIR
"""
import copy
import glob
import json
import os
import random
import subprocess
import sys
import time
import warnings

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_resnet as cr  # noqa: E402 (reads BUILD_DIR TMP_DIR from sys.argv, as this script takes them)
from psd._proto import ps_pb2  # noqa: E402  (check_resnet put python/ on the path)
from psd.checkpoint import read_safetensors  # noqa: E402
from sharebn import RecurrentDepth, SiameseBN, Triplet  # noqa: E402

BATCH, STEPS = 8, 4
CASES = [
    # (label, class, per-sample input shape, lines the model file must hold, --check-config lines)
    ("siamese CNN (SimCLR-style)", SiameseBN, [6, 8, 8],
     ["name: encoder.1_1, kind: BatchNorm2d", "share: encoder.1}", "share: encoder.5}", "share: encoder.9}"],
     ["shared: encoder.1_1 uses the parameters and buffers of encoder.1",
      "shared: encoder.9_1 uses the parameters and buffers of encoder.9"]),
    ("triplet network (BatchNorm1d affine=False, momentum=None)", Triplet, [3, 10],
     ["name: encoder.1_2, kind: BatchNorm1d", "momentum: null, affine: false, share: encoder.1}"],
     ["shared: encoder.1_1 uses the buffers of encoder.1", "shared: encoder.1_2 uses the buffers of encoder.1"]),
    ("recurrent-depth block applied three times", RecurrentDepth, [8],
     ["name: block.1_2, kind: BatchNorm1d", "share: block.1}"],
     ["shared: block.1_2 uses the parameters and buffers of block.1"]),
]


def batch(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn([BATCH] + shape, generator=g) * 1.5 + 0.3, torch.randint(0, 3, (BATCH,), generator=g)


def moved(cls, name):
    """The module with its parameters moved (check_resnet.moved) and running statistics off their defaults:
    a few training forwards of PyTorch's own."""
    def stats(model):
        model.train()
        for s in range(3):
            model(batch(shape_of(cls), 100 + s)[0])
    return cr.moved(cls, name, after=stats)


def shape_of(cls):
    return next(c[2] for c in CASES if c[1] is cls)


def rel(a, b):
    """|a - b| relative to b's largest (at least 1e-3: a bias of rounding noise)."""
    a, b = np.asarray(a, np.float64).reshape(-1), np.asarray(b, np.float64).reshape(-1)
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-3)) if b.size else 0.0


def grad_err(got, g32, g64):
    """psd's gradient against PyTorch's: relative to the tensor's largest, or (a Linear bias before a training
    BatchNorm, whose gradient is 0 but for rounding) psd's error against float64 within 8x PyTorch float32's:
    scaled so that <= 1e-4 passes."""
    if got is None:
        return float("inf")
    e = rel(got, g32)
    d, d32 = (float(np.max(np.abs(np.asarray(v, np.float64).reshape(-1) - g64.reshape(-1)))) for v in (got, g32))
    return min(e, 1e-4 * d / max(8 * d32, 1e-30))


def loop(label, stub, model, shape, seed):
    """STEPS SGD steps through psd beside PyTorch's own loop on the same batches."""
    opt = torch.optim.SGD(model.parameters(), lr=cr.LR)
    params = dict(model.named_parameters())
    for step in range(STEPS):
        x, target = batch(shape, seed + step)
        model.train()
        m64 = copy.deepcopy(model).double()
        y = model(x)
        loss = F.cross_entropy(y, target)
        gy = torch.autograd.grad(loss, y, retain_graph=True)[0]
        opt.zero_grad()
        y.backward(gy)
        m64(x.double()).backward(gy.double())
        p64 = dict(m64.named_parameters())
        ctx = random.randint(1, 1 << 60)
        r = stub.Forward(ps_pb2.ForwardRequest(context_id=ctx, seq=0, train=True, trainer_rank=1,
                                               input=cr.tensor(x.numpy())), timeout=60)
        e_out = rel(cr.array(r.output), y.detach().numpy())
        stub.Backward(ps_pb2.BackwardRequest(context_id=ctx, seq=0, grad_output=cr.tensor(gy.numpy())), timeout=60)
        grads = cr.get_gradients(stub, ctx)
        e_g, g_name = max(((grad_err(grads.get(k), p.grad.numpy(), p64[k].grad.numpy()), k)
                           for k, p in params.items()), default=(0.0, ""))
        opt.step()
        stub.Step(ps_pb2.StepRequest(context_id=ctx), timeout=60)
        after = cr.get_parameters(stub)
        sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
        cr.check(set(after) == set(sd), "%s step %d: psd's tensors are the state_dict's names (%s)"
                 % (label, step + 2, sorted(set(after) ^ set(sd))[:4]))
        floats = [(rel(after[k], sd[k]) if k in after else float("inf"), k) for k in sd if sd[k].dtype != np.int64]
        e_w, w_name = max(floats)
        counts = [k for k in sd if sd[k].dtype == np.int64]
        bad = [k for k in counts if k not in after or not np.array_equal(after[k].reshape(sd[k].shape), sd[k])]
        cr.check(e_out <= 1e-4 and e_g <= 1e-4 and e_w <= 1e-4 and not bad,
                 "%s step %d of PyTorch's own loop: training output (%.2g), %d gradients (worst %s %.2g), then %d "
                 "parameters and running statistics (worst %s %.2g) within 1e-4 of the tensor's largest; %s = "
                 "PyTorch's (%s)" % (label, step + 2, e_out, len(params), g_name, e_g, len(floats), w_name, e_w,
                                     ", ".join("%s %s" % (k, int(sd[k])) for k in counts), bad))


def newest_ckpt(d, after, timeout=60):
    t0 = time.time()
    while time.time() - t0 < timeout:
        files = sorted(f for f in glob.glob(os.path.join(d, "ckpt-*.safetensors")) if ".optim." not in f)
        if files and files[-1] != after:
            return files[-1]
        time.sleep(0.2)
    return None


def checkpoint(label, name, y, stub, p, model, x, ckdir):
    """psd's newest checkpoint: the state_dict's keys, psd's values, a strict load with equal buffers, its eval
    forward psd's and PyTorch's loop's."""
    now = cr.get_parameters(stub)
    steps = int(np.sum([now[k] for k in now if k.endswith("num_batches_tracked")]))
    path, ck = None, None
    t0 = time.time()
    while time.time() - t0 < 60:       # the checkpoint of the last step (written after it, by rename)
        path = newest_ckpt(ckdir, None)
        if path:
            ck, _ = read_safetensors(path)
            if int(np.sum([ck[k].numpy() for k in ck if k.endswith("num_batches_tracked")])) == steps:
                break
        time.sleep(0.3)
    cr.check(ck is not None, "%s: psd wrote a checkpoint after the last step (%s)" % (label, ckdir))
    if ck is None:
        return
    want = set(model.state_dict())
    cr.check(set(ck) == want, "%s: the checkpoint holds the state_dict's %d keys, each BatchNorm's buffers once "
             "(%s)" % (label, len(want), sorted(set(ck) ^ want)[:4]))
    bad = [k for k in now if k not in ck or not np.array_equal(ck[k].numpy().reshape(-1), now[k].reshape(-1))]
    cr.check(not bad, "%s: every checkpoint tensor is psd's value (%s)" % (label, bad[:4]))
    loaded, err = cr.strict_load(label, model, ck)
    if err:
        return
    bufs = dict(loaded.named_buffers())
    bad = [k for k, b in bufs.items() if not np.array_equal(b.numpy().reshape(-1), now[k].reshape(-1))]
    cr.check(bufs and not bad, "%s: the loaded module's %d buffers equal psd's (%s)" % (label, len(bufs), bad[:4]))
    loaded.eval()
    model.eval()
    with torch.no_grad():
        mine, theirs = loaded(x).numpy(), model(x).numpy()
    r = stub.Forward(ps_pb2.ForwardRequest(input=cr.tensor(x.numpy()), train=False), timeout=60)
    cr.close(cr.array(r.output), mine, 1e-4, 1e-5, "%s: eval forward (the shared running statistics at every "
             "site): psd's = the loaded module's" % label)
    cr.check(rel(cr.array(r.output), theirs) <= 1e-4, "%s: eval forward after %d steps within 1e-4 of PyTorch's "
             "loop's module (%.2g)" % (label, STEPS + 1, rel(cr.array(r.output), theirs)))
    p.kill()
    p.wait()
    stub2, p2 = cr.start_psd(name + "_resumed", "file: %s" % y, [], "  checkpoint_dir: %s\n" % ckdir)
    again = cr.get_parameters(stub2)
    bad = [k for k in now if k not in again or not np.array_equal(again[k], now[k])]
    cr.check(set(again) == set(now) and not bad, "%s: psd restarted from the checkpoint resumes every parameter and "
             "buffer (%s)" % (label, bad[:4] or sorted(set(again) ^ set(now))[:4]))
    p2.kill()


def main():
    pe = cr.load_psd_export()
    for i, (label, cls, shape, lines, config) in enumerate(CASES):
        name = "sharebn_%d" % i
        y = os.path.join(cr.TMP, name + ".yaml")
        rc = pe.main([os.path.join(HERE, "sharebn.py") + ":" + cls.__name__, "--kwargs", json.dumps({}),
                      "--seed", "7", "--input-shape", ",".join(map(str, shape)), "-o", y])
        cr.check(rc == 0, "psd-export of %s" % label)
        if rc:
            continue
        text = open(y).read()
        missing = [ln for ln in lines if ln not in text]
        cr.check(not missing, "%s: the model file holds %s (missing %s)" % (label, lines, missing))
        cfg = os.path.join(cr.TMP, name + ".check.yaml")
        with open(cfg, "w") as f:
            f.write("model:\n  file: %s\n" % y)
        r = subprocess.run([os.path.join(cr.BUILD, "bin", "psd"), "--check-config", cfg], capture_output=True,
                           text=True, timeout=120)
        rc, out = r.returncode, r.stdout + r.stderr
        missing = [ln for ln in config if ln not in out]
        cr.check(rc == 0 and not missing, "%s: psd --check-config lists %s (missing %s): %s"
                 % (label, config, missing, out.strip()[-300:]))
        model, w = moved(cls, name)
        x, target = batch(shape, 10 * i)
        ckdir = os.path.join(cr.TMP, name + "_ckpt")
        stub, p = cr.start_psd(name, "file: %s" % y, ["--init-from", w],
                               "  checkpoint_dir: %s\n  checkpoint_every_steps: 1\n" % ckdir)
        listed = [t.name for t in stub.ListParameters(ps_pb2.ListParametersRequest(), timeout=30).parameters]
        want = list(model.state_dict())
        cr.check(sorted(listed) == sorted(want), "%s: ListParameters lists the state_dict's %d names once each, "
                 "every BatchNorm's buffers under its first call's (%s)"
                 % (label, len(want), sorted(set(listed) ^ set(want))[:4] or
                    [k for k in set(listed) if listed.count(k) > 1][:4]))
        onnx_model = copy.deepcopy(model)
        cr.run(label, stub, model, x, target, ref64=True)      # psd's first step; steps model as PyTorch does
        loop(label, stub, model, shape, 10 * i + 1)
        checkpoint(label, name, y, stub, p, model, x, ckdir)
        p.kill()
        if cls is not Triplet:   # its BatchNorm(affine=False) exports its weight as a computed Constant
            onnx(label, name, onnx_model, x, target, shape, 10 * i + 1)


def onnx(label, name, model, x, target, shape, seed):
    """The module's training-mode ONNX export: the BatchNormalization nodes of one module read the same
    initializers (one node of psd's, share: at the later ones); run() and the loop as for psd-export's file."""
    path = os.path.join(cr.TMP, name + "_train.onnx")
    model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, x, path, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                          opset_version=13)
    # the export traced a training forward: the running statistics moved (at every site) and the file holds
    # them; ONNX has no num_batches_tracked: psd starts it at 0 (check_resnet.both_paths)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.num_batches_tracked.zero_()
    label = label.split(" (")[0] + " onnx training export"
    stub, p = cr.start_psd(name + "_onnx", "onnx: %s" % path, [])
    cr.run(label, stub, model, x, target, ref64=True)
    loop(label, stub, model, shape, seed)
    p.kill()


if __name__ == "__main__":
    cr.run_main(main)
