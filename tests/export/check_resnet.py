#!/usr/bin/python3
"""tests/it_resnet.sh's Python half: torchvision's resnet18(num_classes=10),
and mobilenet_v2(num_classes=10, dropout=0) (ReLU6: ONNX's Clip(0, 6)),
through psd, against PyTorch, twice each:

  psd-export  the model file and weights psd-export writes, psd started
              with --init-from the weights;
  onnx        the module's training-mode ONNX export
              (torch.onnx.export(..., training=TrainingMode.TRAINING,
              do_constant_folding=False)), psd started with model.onnx (its
              initializers are the initial weights).

For each, with a batch of 4 at 3x64x64 (psd: model.backend dnnl, SGD lr
0.01, hogwild):
  - psd's initial parameters and buffers are the module's (exactly);
  - an eval Forward equals the module in eval mode, and a training Forward
    the module in train mode (batch statistics), both rtol 1e-4 (atol 1e-5);
  - one Backward of the cross-entropy's output gradient: every gradient
    (GetGradients) within 1e-4 of that tensor's largest |gradient| of
    PyTorch autograd's (mobilenet_v2: against float64 autograd, within 8x
    PyTorch float32's own error or that 1e-4 - its BatchNorm biases before
    a linear path to the next BatchNorm have gradients of rounding noise,
    and its early gradients carry 17 blocks of float32 BatchNorm backward;
    where that fails, a ReLU input within float32 error of 0 may have gone
    the other way in psd's float32 forward: the float64 gradients with up
    to 4 such decisions turned over (relu_flips) may stand in for float64's
    own, and the check says which ReLU element it took; the new weights
    against w - lr * psd's gradient);
  - Step: the new weights (GetParameters) within 1e-5 of torch.optim.SGD's,
    relative to each tensor's largest value, the running statistics
    (running_mean, running_var) likewise of the module's after its training
    forward, and num_batches_tracked equal;
  - psd's parameters and buffers after the step, in psd's shapes, load
    into the module with load_state_dict(strict=True);
  - an eval Forward after the step equals the module's (rtol 1e-4).

Then the model's eval export (BatchNorm folded into the convolutions,
onnx::* names): psd's eval Forward equals the module's. word_language_
model's RNNModel through its training and eval exports: stages pre,
post and the trainer's LSTM, every parameter equal to the state_dict (the
LSTM's gate glue undone), the stages' forwards equal. And the RPC
tutorial's Net, which PyTorch 1.13 cannot export in training mode (its
Dropout2d): its eval export (model.onnx) and configs/models/mnist_cnn.yaml
with dropout off (--init-from its weights) each go through the checks
above against the module with dropout off.

    check_resnet.py BUILD_DIR TMP_DIR [MODEL ...]

With MODEL names (make test-zoo: mobilenet_v3_small, regnet_x_400mf,
regnet_y_400mf, ..., convnext_tiny with stochastic_depth_prob 0,
densenet121, shufflenet_v2_x0_5), only those torchvision models, each
both ways as mobilenet_v2 above (mobilenets' dropout 0, gradients
against float64;
a training forward or running statistics past the fixed tolerances pass
when psd's error against float64 autograd is within 8x PyTorch
float32's own - regnet's 22 BatchNorm blocks at 2x2 in the last stage).
efficientnet_b0 and efficientnet_v2_s with stochastic_depth_prob=0 and
their classifier's dropout at 0 (tests/export/zoo_builders.py; psd draws
its own masks);
vit_small (tests/export/zoo_builders.py: torchvision's VisionTransformer
at 32x32 in 8x8 patches, 2 layers of 4 heads over 64 dims, its zero head
and class token drawn small so every gradient shows; a 32x32 batch)
both ways, the input gradient too (input_gradient: its ONNX export's
nn.MultiheadAttention decomposition read back as MultiheadAttention nodes,
its class token's Expand as a Parameter, every name the state_dict's);
vit_b_16 (by hand, at 64x64) the same;
swin_small (tests/export/zoo_builders.py: torchvision's SwinTransformer at
40x40, 4x4 patches and windows, 3 stages of 2 blocks; a 40x40 batch) and
swin_t (by hand, at 64x64, its stochastic depth off) through psd-export
only, the input gradient too (its Pad, Roll, RelativePositionBias with the
shifted-window mask and the patch merging's strided Narrows; every int64
buffer, relative_position_index among them, equal to the module's);
alexnet (dropout 0; no BatchNorm: float32 tolerances) through psd-export
only - its 1x1 features adaptively pooled to 6x6, which PyTorch's ONNX
exporter refuses.
"""
import atexit
import collections
import contextlib
import copy
import io
import importlib.machinery
import importlib.util
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import warnings

import grpc
import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
from psd._proto import ps_pb2, ps_pb2_grpc  # noqa: E402
from psd.client import read_pages  # noqa: E402

BUILD, TMP = sys.argv[1], sys.argv[2]
LR = 0.01
F32, I64 = ps_pb2.FLOAT32, ps_pb2.INT64
failures = []
procs = []


def check(ok, what):
    if ok:
        print("ok:", what)
    else:
        print("FAIL:", what)
        failures.append(what)


def tensor(a):
    """a as a request's tensor: int64 token ids as INT64, anything else as FLOAT32."""
    if np.asarray(a).dtype == np.int64:
        a = np.ascontiguousarray(a)
        return ps_pb2.Tensor(shape=list(a.shape), data=a.tobytes(), dtype=I64)
    a = np.ascontiguousarray(a, dtype=np.float32)
    return ps_pb2.Tensor(shape=list(a.shape), data=a.tobytes(), dtype=F32)


def as64(x):
    """x for a float64 copy of a model: floats as float64, token ids as they are."""
    return x.double() if x.is_floating_point() else x


def array(t):
    return np.frombuffer(t.data, dtype=np.float32 if t.dtype == F32 else np.int64).reshape(tuple(t.shape))


PORTS_DIR = os.path.join(os.environ.get("TMPDIR", "/tmp"), "ps-test-ports")
_reserved = []


def _release_ports():
    for b in _reserved:
        try:
            if os.readlink(os.path.join(PORTS_DIR, b)) == str(os.getpid()):
                os.unlink(os.path.join(PORTS_DIR, b))
        except OSError:
            pass


atexit.register(_release_ports)


def free_port():
    """The first of 16 consecutive ports (20000..32767, below Linux's ephemeral range) that nothing listens on,
    reserved until this process exits - tests/lib.sh's free_port and its directory of reservations (a symlink per
    block naming its owner's pid), so that tests running side by side never pick the same port."""
    os.makedirs(PORTS_DIR, exist_ok=True)
    for _ in range(200):
        b = str(random.randrange(798))
        link = os.path.join(PORTS_DIR, b)
        try:
            os.symlink(str(os.getpid()), link)
        except FileExistsError:
            try:
                owner = int(os.readlink(link))
                os.kill(owner, 0)
                continue
            except ProcessLookupError:  # a killed test's block: take it over
                try:
                    os.unlink(link)
                    os.symlink(str(os.getpid()), link)
                except OSError:
                    continue
            except (OSError, ValueError):
                continue
        _reserved.append(b)
        p = 20000 + 16 * int(b)
        if all(_closed(p + i) for i in range(16)):
            return p
    raise RuntimeError("no free port block in %s" % PORTS_DIR)


def _closed(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def start_psd(name, model_line, extra, server_extra=""):
    cfg = os.path.join(TMP, name + ".conf.yaml")
    with open(cfg, "w") as f:
        # psd's default message limit (64 MiB): alexnet's gradients (228 MB) and convnext_tiny's (111 MB)
        # come in pages (GetGradients pages as GetParameters does)
        f.write("model:\n  %s\n  backend: dnnl\noptimizer:\n  type: sgd\n  lr: %g\n  momentum: 0\n"
                "server:\n  consistency: hogwild\n%s" % (model_line, LR, server_extra))
    for attempt in range(5):
        started = start_on(name, cfg, extra, "127.0.0.1:%d" % free_port())
        if started is not None:
            return started
    raise RuntimeError("psd (%s) found no free port in 5 tries" % name)


def fit_psd(name, model_file, optimizer, extra=()):
    """psd serving model_file (hogwild; optimizer: its YAML lines, e.g. "type: sgd\n  lr: 0.1") for a `ps-train fit`
    run, started with extra arguments (--init-from): (address, config path, process) once it serves, on another
    port when the first was taken. ps-train reads the same config (--config)."""
    cfg = os.path.join(TMP, name + ".conf.yaml")
    with open(cfg, "w") as f:
        f.write("model:\n  file: %s\noptimizer:\n  %s\nserver:\n  consistency: hogwild\n" % (model_file, optimizer))
    for attempt in range(5):
        addr = "127.0.0.1:%d" % free_port()
        started = start_on(name, cfg, list(extra), addr)
        if started is not None:
            return addr, cfg, started[1]
    raise RuntimeError("psd (%s) found no free port in 5 tries" % name)


def start_on(name, cfg, extra, addr):
    """psd on config cfg listening on addr: (stub, process) once it answers; None when the port was taken between
    free_port() and psd's bind (another test's process: try another port); RuntimeError when psd does not start."""
    log = open(os.path.join(TMP, name + ".log"), "w")
    p = subprocess.Popen([os.path.join(BUILD, "bin", "psd"), "--config", cfg, "--listen", addr] + extra,
                         stderr=log, stdout=log)
    procs.append(p)
    t0 = time.time()
    # the port first: a gRPC channel whose first connection is refused stays in backoff ~5 s (grpcio 1.51), which
    # each start-up used to wait after psd was serving (~0.2 s)
    while p.poll() is None and time.time() - t0 < 120:
        with socket.socket() as sk:
            if sk.connect_ex(("127.0.0.1", int(addr.rsplit(":", 1)[1]))) == 0:
                break
        time.sleep(0.05)
    stub = ps_pb2_grpc.ParameterServerStub(grpc.insecure_channel(addr, options=[
        ("grpc.max_receive_message_length", 256 << 20), ("grpc.max_send_message_length", 256 << 20)]))
    while True:
        try:
            stub.ListParameters(ps_pb2.ListParametersRequest(), timeout=5)
            log.flush()
            if p.poll() is None and " serving model " in open(log.name).read():   # this psd, not another on the port
                return stub, p
        except grpc.RpcError:
            pass
        if p.poll() is not None or time.time() - t0 > 120:
            log.close()
            said = open(log.name).read()
            if p.poll() is not None and "is already in use" in said:
                return None
            raise RuntimeError("psd (%s) did not start: %s" % (name, said[-2000:]))
        time.sleep(0.3)


def get_parameters(stub):
    """Every parameter and buffer by name (pages joined by psd's client)."""
    got, _ = read_pages(lambda req: stub.GetParameters(req, timeout=60), ps_pb2.GetParametersRequest(), "parameters",
                        "psd")
    return {k: v.numpy() for k, v in got.items()}


def get_gradients(stub, ctx):
    """Every gradient of context ctx by name (GetGradients' pages joined)."""
    got, _ = read_pages(lambda req: stub.GetGradients(req, timeout=120), ps_pb2.GetGradientsRequest(context_id=ctx),
                        "gradients", "psd")
    return {k: v.numpy() for k, v in got.items()}


def close(got, want, rtol, atol, what):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        check(False, "%s: shape %s, PyTorch's %s" % (what, got.shape, want.shape))
        return
    err = np.abs(got - want) - (atol + rtol * np.abs(want))
    i = int(np.argmax(err))
    check(err.flat[i] <= 0, "%s (worst element %d: %.8g vs %.8g)" % (what, i, got.flat[i], want.flat[i]))


def relu_flips(model, x, gy, k=4):
    """float64 autograd's parameter gradients with ReLU decisions turned over.

    A ReLU input within float32 rounding of 0 can land on either side in a
    float32 forward, psd's or PyTorch's: on one AVX2 host psd's regnet_x
    took block4-9's last ReLU at an element whose float64 input is 6.4e-5
    the other way (so did PyTorch's own float32 run under
    ONEDNN_MAX_CPU_ISA=SSE41), and the gradients of the blocks before it
    moved by up to ~5 % of a tensor's largest value. So: over every nn.ReLU
    call, the k inputs nearest 0 measured in the float32 error at that
    point (|float64 input| / the largest |float32 - float64| of PyTorch's
    float32 forward over that call's tensor), and for each non-empty set of
    them the float64 gradients with those decisions turned over (an element
    that was cut passes, one that passed is cut). Yields (what, {name:
    gradient}); nothing when the model has no nn.ReLU module."""
    m, m32 = copy.deepcopy(model).double(), copy.deepcopy(model)
    relus = [(n, mod) for n, mod in m.named_modules() if isinstance(mod, torch.nn.ReLU)]
    if not relus:
        return
    for mm in (m, m32):
        for mod in mm.modules():
            if isinstance(mod, torch.nn.ReLU):
                mod.inplace = False
    inputs, calls = {}, collections.Counter()

    def record(name, dtype):
        def hook(mod, inp, out):
            c = calls[name, dtype]
            calls[name, dtype] += 1
            inputs[name, c, dtype] = inp[0].detach().double().flatten()
        return hook
    for mm, dtype in ((m, 64), (m32, 32)):
        hooks = [mod.register_forward_hook(record(n, dtype)) for n, mod in mm.named_modules()
                 if isinstance(mod, torch.nn.ReLU)]
        with torch.no_grad():
            mm(x.double() if dtype == 64 else x)
        for h in hooks:
            h.remove()
    seen = []
    for (name, c, dtype), a in inputs.items():
        if dtype != 64 or (name, c, 32) not in inputs:
            continue
        noise = float((inputs[name, c, 32] - a).abs().max()) or 1e-30
        r, i = torch.topk(a.abs() / noise, min(k, a.numel()), largest=False)
        seen.extend((float(rr), name, c, int(ii), float(a[ii])) for rr, ii in zip(r, i))
    cand = sorted(seen)[:k]

    def flipped(chosen):
        calls.clear()

        def flip(name):
            def hook(mod, inp, out):
                c = calls[name]
                calls[name] += 1
                idx = [i for (_, n, cc, i, _) in chosen if n == name and cc == c]
                if not idx:
                    return out
                mask = torch.zeros(out.numel(), dtype=torch.bool)
                mask[idx] = True
                return torch.where(mask.view(out.shape), inp[0] - out, out)   # cut <-> passed, gradient too
            return hook
        hs = [mod.register_forward_hook(flip(n)) for n, mod in relus]
        m.zero_grad()
        m(as64(x)).backward(gy.double())
        for h in hs:
            h.remove()
        return {n: p.grad.numpy() for n, p in m.named_parameters()}
    for bits in range(1, 1 << len(cand)):
        chosen = [c for j, c in enumerate(cand) if bits >> j & 1]
        yield (", ".join("%s[%d] (float64 input %.3g)" % (n, i, v) for (_, n, _, i, v) in chosen), flipped(chosen))


def input_gradient(label, stub, model, x, target):
    """d loss / d input of one training Forward + Backward against PyTorch autograd's (within 1e-4 of its
    largest |value|): the gradient a stage before this one would receive."""
    model = copy.deepcopy(model).train()
    xr = x.clone().requires_grad_(True)
    y = model(xr)
    gy = torch.autograd.grad(F.cross_entropy(y, target), y, retain_graph=True)[0]
    y.backward(gy)
    ctx = random.randint(1, 1 << 60)
    stub.Forward(ps_pb2.ForwardRequest(context_id=ctx, seq=0, train=True, trainer_rank=1, input=tensor(x.numpy())),
                 timeout=60)
    r = stub.Backward(ps_pb2.BackwardRequest(context_id=ctx, seq=0, grad_output=tensor(gy.numpy()),
                                             want_input_grad=True), timeout=60)
    got, want = array(r.input_grads[0]).reshape(x.shape), xr.grad.numpy()
    e = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))
    check(e <= 1e-4, "%s: the input gradient within 1e-4 of its largest |value| of PyTorch's (%.3g)" % (label, e))


def run(label, stub, model, x, target, ref64=False, folded=(), tied=None):
    """The checks of the docstring; ref64: gradients against float64 autograd (below). folded: buffers
    psd-export folded into the model file as masks (minGPT's attn.bias), not in psd's state_dict: left out of
    the comparisons, and the strict load takes them from the module. tied: {alias: owner} of tied parameters
    (docs/models.md "Shared parameters"): psd lists the owner once; its value stands for both state_dict keys."""
    tied = tied or {}
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items() if k not in folded}
    got = get_parameters(stub)
    got.update((a, got[o]) for a, o in tied.items() if o in got and a not in got)
    check(set(got) == set(sd), "%s: psd's parameters and buffers are the state_dict's %d names (%s)"
          % (label, len(sd), sorted(set(got) ^ set(sd))[:4]))
    bad = [k for k in sd if k in got and not np.array_equal(got[k].reshape(sd[k].shape), sd[k])]
    check(not bad, "%s: psd's initial values are the module's exactly (%s)" % (label, bad[:4]))

    model.eval()
    with torch.no_grad():
        want = model(x).numpy()
    r = stub.Forward(ps_pb2.ForwardRequest(input=tensor(x.numpy()), train=False), timeout=120)
    close(array(r.output), want, 1e-4, 1e-5, "%s: eval forward = PyTorch's eval mode" % label)

    model.train()
    m64 = copy.deepcopy(model).double() if ref64 else None
    ctx = random.randint(1, 1 << 60)
    y = model(x)
    r = stub.Forward(ps_pb2.ForwardRequest(context_id=ctx, seq=0, train=True, trainer_rank=1,
                                           input=tensor(x.numpy())), timeout=120)
    y64 = m64(as64(x)) if ref64 else None
    if ref64 and not np.allclose(array(r.output), y.detach().numpy(), 1e-4, 1e-5):
        # a deep BatchNorm net's training forward carries float32 error past that: psd's against float64
        # within 8x PyTorch float32's own
        e, e32 = (float(np.max(np.abs(v - y64.detach().numpy()))) for v in (array(r.output), y.detach().numpy()))
        check(e <= 8 * e32, "%s: training forward: psd's error against float64 %.3g, within 8x PyTorch float32's "
              "(%.3g)" % (label, e, e32))
    else:
        close(array(r.output), y.detach().numpy(), 1e-4, 1e-5, "%s: training forward = PyTorch's train mode" % label)
    loss = F.cross_entropy(y, target)
    gy = torch.autograd.grad(loss, y, retain_graph=True)[0]
    model.zero_grad()
    y.backward(gy)
    stub.Backward(ps_pb2.BackwardRequest(context_id=ctx, seq=0, grad_output=tensor(gy.numpy())), timeout=120)
    grads = get_gradients(stub, ctx)
    params = dict(model.named_parameters())
    worst, wname = 0.0, ""
    if ref64:
        # A deep BatchNorm net (mobilenet_v2): a BatchNorm bias that only linear maps lead to the next
        # training-mode BatchNorm has a gradient of exactly 0, so both float32 results are rounding noise,
        # and the early layers' gradients carry the float32 error of every BatchNorm backward after them.
        # So: psd's error against float64 autograd (the same gy) within 8x PyTorch float32's own, or 1e-4 of
        # the tensor's largest |gradient| (a wrong gradient is off by orders of magnitude more).
        y64.backward(gy.double())
        p64 = dict(m64.named_parameters())

        # 8x PyTorch float32's own error, per tensor (the same against every reference below)
        f32 = {k: 8 * float(np.max(np.abs(p.grad.numpy().astype(np.float64) - p64[k].grad.numpy())))
               for k, p in params.items()}

        def against(ref):   # (worst share of the allowance, its tensor) of psd's gradients against ref
            w, wn = 0.0, ""
            for k, p in params.items():
                r = ref[k]
                allowed = max(1e-4 * float(np.max(np.abs(r))), f32[k], 1e-30)
                e = float(np.max(np.abs(grads[k].reshape(r.shape) - r))) / allowed if k in grads else float("inf")
                if e > w:
                    w, wn = e, k
            return w, wn
        worst, wname = against({k: p.grad.numpy() for k, p in p64.items()})
        how = ""
        if worst > 1 and set(grads) == set(params):
            # a ReLU decision psd's float32 forward took the other way (relu_flips): the float64 gradients of
            # that forward are the reference then
            for what, ref in relu_flips(model, x, gy):
                w, wn = against(ref)
                if w <= 1:
                    how = "; against float64 with the ReLU at %s turned over, as psd's float32 forward took it " \
                          "(%.3g of the allowance against float64 as it is, at %s)" % (what, worst, wname)
                    worst, wname = w, wn
                    break
        check(set(grads) == set(params) and worst <= 1, "%s: %d gradients: psd's error against float64 autograd "
              "within 8x PyTorch float32's or 1e-4 of the tensor's largest (worst %s: %.3g of that%s)"
              % (label, len(params), wname, worst, how))
    else:
        for k, p in params.items():
            g = p.grad.numpy()
            e = float(np.max(np.abs(grads[k].reshape(g.shape) - g)) / max(float(np.max(np.abs(g))), 1e-30)) \
                if k in grads else float("inf")
            if e > worst:
                worst, wname = e, k
        check(set(grads) == set(params) and worst <= 1e-4, "%s: %d gradients within 1e-4 of each tensor's "
              "largest |gradient| (worst %s: %.3g)" % (label, len(params), wname, worst))
    # ref64: the step is checked against psd's own gradients (checked above): w - LR * g
    own = {k: p.detach().numpy() - np.float32(LR) * grads[k].reshape(p.shape) for k, p in params.items()} \
        if ref64 else {}
    with torch.no_grad():
        for p in params.values():
            p -= LR * p.grad
    stub.Step(ps_pb2.StepRequest(context_id=ctx), timeout=120)
    after = get_parameters(stub)
    after.update((a, after[o]) for a, o in tied.items() if o in after and a not in after)
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items() if k not in folded}
    sb64 = {k: v.detach().numpy() for k, v in m64.state_dict().items()} if ref64 else {}
    # relative to each tensor's largest value (elements near zero have no relative error of their own), at
    # least 0.01 (a zero-initialised bias moved by LR times a gradient of rounding noise)
    for kind, keys in (("weights", [k for k in sd if k in params]),
                       ("running statistics", [k for k in sd if k not in params and k not in tied and
                                               sd[k].dtype != np.int64])):
        if not keys:
            continue        # a model without buffers
        worst, wname = 0.0, ""
        for k in keys:
            a, b = after[k].reshape(sd[k].shape).astype(np.float64), own.get(k, sd[k]).astype(np.float64)
            e = float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 0.01 if kind == "weights" else 1e-30))
            if e > 1e-5 and ref64 and kind != "weights":   # the batch statistics' float32 error, as the forward's
                b64 = sb64[k].astype(np.float64)
                if np.max(np.abs(a - b64)) <= 8 * np.max(np.abs(b - b64)):
                    e = 0.0
            if e > worst:
                worst, wname = e, k
        check(worst <= 1e-5, "%s: after the step, %d %s within 1e-5 of each tensor's largest value of %s "
              "(worst %s: %.3g)" % (label, len(keys), kind, "w - lr * psd's gradient" if ref64 and kind == "weights"
                                    else "PyTorch's" + (" (or psd's error against float64 within 8x PyTorch "
                                                        "float32's)" if ref64 else ""), wname, worst))
    # psd's tensors as they are (its shapes, not reshaped) load into the module strictly: a checkpoint's
    # names and shapes are PyTorch's (convnext's layer_scale (C, 1, 1))
    psd_sd = collections.OrderedDict((k, torch.from_numpy(np.array(v))) for k, v in after.items())
    psd_sd.update((k, model.state_dict()[k]) for k in folded)
    psd_sd._metadata = model.state_dict()._metadata     # the modules' versions (mnasnet reads its own)
    try:
        copy.deepcopy(model).load_state_dict(psd_sd, strict=True)
        loaded = ""
    except Exception as e:                               # noqa: BLE001 - any refusal is the finding
        loaded = "%s: %s" % (type(e).__name__, str(e).splitlines()[0])
    also = " (with the masks folded into the model file, %s, from the module)" % ", ".join(folded) if folded else ""
    check(not loaded, "%s: after the step, psd's parameters and buffers load into the module with "
          "load_state_dict(strict=True)%s %s" % (label, also, loaded))
    counts = [k for k in sd if sd[k].dtype == np.int64]
    bad = [k for k in counts if not np.array_equal(after[k].reshape(sd[k].shape), sd[k])]
    if counts:
        check(not bad, "%s: after the step, %d int64 buffers (num_batches_tracked, swin's relative_position_index) = "
              "PyTorch's (%s)" % (label, len(counts), bad[:3]))
    model.eval()
    with torch.no_grad():
        want = model(x).numpy()
    r = stub.Forward(ps_pb2.ForwardRequest(input=tensor(x.numpy()), train=False), timeout=120)
    if ref64 and not np.allclose(array(r.output), want, 1e-4, 1e-5):
        # psd's weights are w - lr * psd's gradient (checked above), PyTorch's its own: a net whose eval mode
        # barely normalises (mnasnet's BatchNorm momentum 0.0003 keeps the running statistics at 0 and 1)
        # carries their float32 difference past 1e-4. So: PyTorch's eval forward of psd's own state, as the
        # training forward's
        mine = copy.deepcopy(model)
        with torch.no_grad():
            for k, t in mine.state_dict().items():
                t.copy_(torch.from_numpy(after[k].reshape(sd[k].shape).astype(sd[k].dtype)))
            want = mine(x).numpy()
            y64 = mine.double()(x.double() if x.is_floating_point() else x).numpy()
        e, e32 = (float(np.max(np.abs(v - y64))) for v in (array(r.output), want))
        check(e <= max(8 * e32, 1e-5 * float(np.max(np.abs(y64)))), "%s: eval forward after the step, of psd's "
              "weights and statistics: psd's error against float64 %.3g, within 8x PyTorch float32's (%.3g) or "
              "1e-5 of the largest" % (label, e, e32))
    else:
        close(array(r.output), want, 1e-4, 1e-5, "%s: eval forward after the step (running statistics) = "
              "PyTorch's" % label)


def load_psd_export():
    """tools/psd-export as a module (PyTorch imported once for every export)."""
    loader = importlib.machinery.SourceFileLoader("psd_export", os.path.join(ROOT, "tools", "psd-export"))
    spec = importlib.util.spec_from_loader("psd_export", loader)
    pe = importlib.util.module_from_spec(spec)
    loader.exec_module(pe)
    return pe


def strict_load(label, model, ck):
    """A copy of model with checkpoint tensors ck loaded by load_state_dict(strict=True), checked to load:
    (the copy, '' or the refusal)."""
    loaded = copy.deepcopy(model)
    try:
        loaded.load_state_dict(ck, strict=True)
        err = ""
    except Exception as e:   # noqa: BLE001 - any refusal is the finding
        err = "%s: %s" % (type(e).__name__, str(e).splitlines()[0])
    check(not err, "%s: the checkpoint loads into the module with load_state_dict(strict=True) %s" % (label, err))
    return loaded, err


def refused(export, cases, also=""):
    """psd-export refuses each (cls, words) of cases, its last stderr line holding the words (and also):
    export(cls, name) runs it, its first result the exit status."""
    for cls, want in cases:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = export(cls, "refused_" + cls.__name__)[0]
        msg = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else ""
        check(rc != 0 and want in msg and also in msg, "psd-export refuses %s naming it: %s" % (cls.__name__, msg))


def onnx_run(label, model, x, target, name):
    """model's training-mode ONNX export (opset 13) through psd's ONNX import, checked by run() with ref64."""
    path = os.path.join(TMP, name + ".onnx")
    torch.onnx.export(copy.deepcopy(model).train(), x, path, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, opset_version=13)
    stub, p = start_psd(name + "_onnx", "onnx: %s" % path, [])
    run(label, stub, copy.deepcopy(model), x, target, ref64=True)
    p.kill()


def check_config(onnx_path):
    """psd --check-config on a config naming onnx_path: (exit status, its output)."""
    cfg = onnx_path + ".conf.yaml"
    with open(cfg, "w") as f:
        f.write("model:\n  onnx: %s\n" % onnx_path)
    r = subprocess.run([os.path.join(BUILD, "bin", "psd"), "--check-config", cfg], capture_output=True, text=True,
                       timeout=120)
    return r.returncode, r.stdout + r.stderr


def refused_file(what, shape, nodes, want):
    """A one-stage model file (input of per-sample shape, nodes: its node lines in YAML flow form, joined by
    newlines and indented as the file's) that psd --check-config must refuse with want in its message."""
    fd, y = tempfile.mkstemp(prefix="refused_", suffix=".yaml", dir=TMP)
    with os.fdopen(fd, "w") as f:
        f.write("name: r\nstages:\n  - name: main\n    input: {shape: %s}\n    nodes:\n      - %s\n"
                % (shape, nodes))
    with open(y + ".conf.yaml", "w") as f:
        f.write("model:\n  file: %s\n" % y)
    r = subprocess.run([os.path.join(BUILD, "bin", "psd"), "--check-config", y + ".conf.yaml"], capture_output=True,
                       text=True, timeout=60)
    check(r.returncode != 0 and want in r.stderr, "psd --check-config refuses %s naming it (%s)"
          % (what, r.stderr.strip()[-200:]))


def both_paths(pe, name, x, target, ref64=False, onnx=True, input_grad=False, **extra):
    """torchvision's NAME(num_classes=10, **extra) through psd-export (--init-from its weights) and through
    its training-mode ONNX export (opset 13; onnx not True: a string, why not), each checked by run() (and
    input_gradient() first with input_grad: a model without BatchNorm, whose extra training forward would move
    the running statistics); returns the module."""
    import json
    import torchvision
    kwargs = dict(num_classes=10, **extra)
    y = os.path.join(TMP, name + ".yaml")
    sys.path.insert(0, os.path.join(ROOT, "tests", "export"))
    import zoo_builders       # builders with dropout off where torchvision's take no argument for it
    source, build = name, getattr(torchvision.models, name, None)
    if hasattr(zoo_builders, name):
        source, build = os.path.join(ROOT, "tests", "export", "zoo_builders.py") + ":" + name, \
            getattr(zoo_builders, name)
    rc = pe.main([source, "--kwargs", json.dumps(kwargs), "--input-shape", ",".join(str(d) for d in x.shape[1:]),
                  "--seed", "3", "-o", y])
    check(rc == 0, "psd-export " + name)
    torch.manual_seed(3)
    model = build(**kwargs)
    with torch.no_grad():   # running statistics away from 0 and 1, so loading and folding them shows
        for m in model.modules():
            if isinstance(m, (torch.nn.BatchNorm2d, torch.nn.BatchNorm1d)):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
    w = os.path.join(TMP, name + ".safetensors")
    pe.write_safetensors(w, list(model.state_dict().items()), {})
    stub, p = start_psd(name + "_export", "file: %s" % y, ["--init-from", w])
    if input_grad:
        input_gradient("%s psd-export" % name, stub, model, x, target)
    run("%s psd-export" % name, stub, copy.deepcopy(model), x, target, ref64=ref64)
    p.kill()

    if onnx is not True:
        print("skipped: %s onnx training export: %s" % (name, onnx))
        return model
    onnx_path = os.path.join(TMP, name + "_train.onnx")
    m2 = copy.deepcopy(model)
    m2.train()
    torch.onnx.export(m2, x, onnx_path, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      opset_version=13)
    # the export traced a training forward: its running statistics moved, and the file holds them (ONNX has no
    # num_batches_tracked: psd starts it at 0)
    for m in m2.modules():
        if isinstance(m, (torch.nn.BatchNorm2d, torch.nn.BatchNorm1d)):
            m.num_batches_tracked.zero_()
    stub, p = start_psd(name + "_onnx", "onnx: %s" % onnx_path, [])
    if input_grad:
        input_gradient("%s onnx training export" % name, stub, m2, x, target)
    run("%s onnx training export" % name, stub, m2, x, target, ref64=ref64)
    p.kill()
    return model


def zoo_model(pe, name, x, target):
    """One model of make test-zoo (or it_resnet's conv1d_net) both ways, with what it needs."""
    # dropout off where the builder has it (psd draws its own masks)
    extra = {"dropout": 0.0} if name.startswith(("mobilenet", "mnasnet", "squeezenet", "googlenet",
                                                 "alexnet")) else {}
    if name == "googlenet":   # zoo.py's: no auxiliary classifiers (training returns them too)
        extra.update(aux_logits=False, init_weights=False)
    if name.startswith(("efficientnet", "convnext")):   # stochastic depth off (efficientnet's dropout: zoo_builders.py)
        extra.update(stochastic_depth_prob=0.0)
    onnx = True
    if name == "alexnet":     # its 256x1x1 features pooled to 6x6: PyTorch exports factor sizes only
        onnx = "PyTorch's exporter refuses adaptive_avg_pool2d to 6x6 from 1x1 (not a factor)"
    xm = x
    if name.startswith("vit_b"):  # zoo.py's: 64x64 images (vit_b_16 at 224 is 196 tokens)
        extra.update(image_size=64)
    if name == "vit_small":   # zoo_builders.py's VisionTransformer: 32x32 images (vit_b_16 has 86M parameters)
        xm = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    if name.startswith("swin"):   # no ONNX path (docs/models.md, torchvision models)
        onnx = "psd's ONNX import refuses swin's relative position bias (a Transpose of the gathered table)"
    if name == "conv1d_net":  # zoo_builders.py's 1-D CNN: (3, 64) sequences
        xm = torch.randn(4, 3, 64, generator=torch.Generator().manual_seed(2))
    if name == "shrink_net":  # no ONNX path: PyTorch 1.13 writes hardshrink/softshrink as Where subgraphs
        onnx = "PyTorch 1.13 exports hardshrink and softshrink as Where subgraphs and refuses threshold != 0"
    if name == "zero_norm_net":   # the ONNX graph's own arithmetic is NaN there (its norm is Sqrt(ReduceSum(x * x)))
        onnx = "PyTorch's exporter writes x.norm as Sqrt(ReduceSum(x * x)), NaN at a zero vector by its own arithmetic"
    if name in ("eltwise_net", "norm_net", "prelu_net", "shrink_net", "bcast_net", "zero_norm_net"):  # zoo_builders.py's: (3, 16, 16) images
        xm = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    if name == "swin_small":  # zoo_builders.py's SwinTransformer: 40x40 images (10x10 tokens, 4x4 windows)
        xm = torch.randn(4, 3, 40, 40, generator=torch.Generator().manual_seed(1))
    both_paths(pe, name, xm, target, ref64=name != "alexnet", onnx=onnx,
               input_grad=name.startswith(("vit", "swin")),
               **extra)


def main():
    warnings.simplefilter("ignore")
    pe = load_psd_export()
    import torchvision

    torch.manual_seed(0)
    x = torch.randn(4, 3, 64, 64)
    target = torch.randint(0, 10, (4,))
    if sys.argv[3:]:
        for name in sys.argv[3:]:
            zoo_model(pe, name, x, target)
        return

    # 1. psd-export, 2. the training-mode ONNX export of the same module
    model = both_paths(pe, "resnet18", x, target)
    # the same for mobilenet_v2 (ReLU6; ONNX's Clip(0, 6)): the first model the hard activations unblocked.
    # Its classifier's Dropout off: psd draws its own masks
    both_paths(pe, "mobilenet_v2", x, target, ref64=True, dropout=0.0)
    # a 1-D CNN (Conv1d, BatchNorm1d, the 1-d pools) over (4, 3, 64) sequences
    zoo_model(pe, "conv1d_net", x, target)
    # elementwise math as users write it (ELU, Mish, a - b, x + c, sqrt, clamp, SELU, log, exp, x ** 2, rsqrt, ...)
    zoo_model(pe, "eltwise_net", x, target)
    # group and instance normalisation (nn.GroupNorm, nn.InstanceNorm2d, F.group_norm, F.instance_norm)
    zoo_model(pe, "norm_net", x, target)
    # learned and shrinking activations: nn.PReLU, CELU, RReLU, tanhshrink (both paths); Softsign, Hardshrink,
    # Softshrink, Threshold (psd-export)
    zoo_model(pe, "prelu_net", x, target)
    zoo_model(pe, "shrink_net", x, target)
    # numpy broadcasting between computed tensors: centring, standardisation by hand, a gate, a mask, a cosine
    # head, F.cosine_similarity, norms and x.std as values, torch.div of two tensors (ONNX: ReduceL2, Max)
    zoo_model(pe, "bcast_net", x, target)
    # the norm of all-zero vectors: PyTorch's gradient (0), not a NaN (psd-export only)
    zoo_model(pe, "zero_norm_net", x, target)

    # 3. the eval export: BatchNorm folded into the convolutions, the graph psd trains is that one
    eval_path = os.path.join(TMP, "resnet18_eval.onnx")
    m3 = copy.deepcopy(model).eval()
    torch.onnx.export(m3, x, eval_path, opset_version=13)
    stub, p = start_psd("eval", "onnx: %s" % eval_path, [])
    with torch.no_grad():
        want = m3(x).numpy()
    r = stub.Forward(ps_pb2.ForwardRequest(input=tensor(x.numpy()), train=False), timeout=120)
    close(array(r.output), want, 1e-4, 1e-5, "onnx eval export: eval forward = PyTorch's eval mode")
    names = sorted(t.name for t in stub.ListParameters(ps_pb2.ListParametersRequest()).parameters)
    check(not any("running" in n for n in names) and "conv1.weight" in names and "conv1.bias" in names,
          "onnx eval export: BatchNorm folded (no running statistics; conv1 has a bias): %d parameters" % len(names))
    p.kill()

    # 4. the tutorial's Net: PyTorch 1.13 cannot export it in training mode (its Dropout2d), so its eval
    # export is checked against its model file (configs/models/mnist_cnn.yaml) with dropout off, both against
    # the module with p = 0
    sys.path.insert(0, os.path.join(ROOT, "examples", "models"))
    from rpc_tutorials import Net
    torch.manual_seed(5)
    net = Net()
    net.dropout1.p = net.dropout2.p = 0.0
    xn, tn = torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))
    net_onnx = os.path.join(TMP, "net_eval.onnx")
    torch.onnx.export(copy.deepcopy(net).eval(), xn, net_onnx, opset_version=13)
    with open(os.path.join(ROOT, "configs", "models", "mnist_cnn.yaml")) as f:
        text = f.read()
    nodrop = os.path.join(TMP, "mnist_cnn_nodrop.yaml")
    with open(nodrop, "w") as f:
        f.write(text.replace("p: 0.25", "p: 0").replace("p: 0.5", "p: 0"))
    pe.write_safetensors(os.path.join(TMP, "net.safetensors"), list(net.state_dict().items()), {})
    stub, p = start_psd("net_onnx", "onnx: %s" % net_onnx, [])
    run("tutorial Net, eval export", stub, copy.deepcopy(net), xn, tn)
    p.kill()
    stub, p = start_psd("net_file", "file: %s" % nodrop, ["--init-from", os.path.join(TMP, "net.safetensors")])
    run("tutorial Net, mnist_cnn.yaml with p 0", stub, copy.deepcopy(net), xn, tn)
    p.kill()

    # 5. word_language_model's RNNModel through ONNX: the LSTM weight glue (the training export slices and
    # concatenates PyTorch's weight_ih_l<k>... into ONNX's gate order; the eval export stores them reordered)
    from rpc_tutorials import RNNModel
    torch.manual_seed(11)
    lm = RNNModel("LSTM", 50, 8, 8, 2, 0.0)   # PyTorch 1.13 exports no LSTM dropout in training mode
    ids, hidden = torch.randint(0, 50, (5, 3)), lm.init_hidden(3)
    for mode in ("training", "eval"):
        path = os.path.join(TMP, "lm_%s.onnx" % mode)
        tm = torch.onnx.TrainingMode.TRAINING if mode == "training" else torch.onnx.TrainingMode.EVAL
        torch.onnx.export(copy.deepcopy(lm), (ids, hidden), path, opset_version=13, training=tm,
                          do_constant_folding=mode == "eval")
        stub, p = start_psd("lm_" + mode, "onnx: %s" % path, [])
        lp = stub.ListParameters(ps_pb2.ListParametersRequest())
        check([st.name for st in lp.stages] == ["pre", "post", "rnn"],
              "lm %s export: stages pre (embedding), post (decoder) and the trainer's LSTM rnn (%s)"
              % (mode, [st.name for st in lp.stages]))
        got = get_parameters(stub)
        sd = {k: v.numpy() for k, v in lm.state_dict().items()}
        bad = [k for k in sd if k not in got or not np.array_equal(got[k].reshape(sd[k].shape), sd[k])]
        check(set(got) == set(sd) and not bad, "lm %s export: psd's parameters are the state_dict's, exactly - the "
              "LSTM's in PyTorch's gate order (%s %s)" % (mode, sorted(set(got) ^ set(sd))[:3], bad[:3]))
        r = stub.Forward(ps_pb2.ForwardRequest(stage="pre", input=ps_pb2.Tensor(
            shape=list(ids.shape), data=ids.numpy().astype(np.int64).tobytes(), dtype=I64)), timeout=60)
        with torch.no_grad():
            emb = lm.encoder(ids)
            out, _ = lm.rnn(emb, hidden)        # the trainer's LSTM, on psd's weights (equal, checked above)
            want = lm.decoder(out)
        close(array(r.output), emb.numpy(), 1e-6, 1e-7, "lm %s export: stage pre = the embedding" % mode)
        r = stub.Forward(ps_pb2.ForwardRequest(stage="post", input=tensor(out.numpy())), timeout=60)
        close(array(r.output), want.numpy(), 1e-4, 1e-5, "lm %s export: stage post = the decoder" % mode)
        p.kill()


def moved(make, name, seed=7, after=None):
    """make() built under seed, every parameter moved off its initial value by 0.1 N(0, 1) (every gradient then
    shows), after(model) for a script's own adjustment, its state_dict written for psd's --init-from:
    (model, the file's path)."""
    torch.manual_seed(seed)
    model = make()
    with torch.no_grad():
        for t in model.parameters():
            t.add_(torch.randn_like(t) * 0.1)
        if after is not None:
            after(model)
    w = os.path.join(TMP, name + "_moved.safetensors")
    load_psd_export().write_safetensors(w, list(model.state_dict().items()), {})
    return model, w


def run_main(main_fn):
    """A check script's end: main_fn, then every psd it started stopped, exit 1 when a check failed."""
    try:
        main_fn()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    print("%d failed" % len(failures) if failures else "all checks passed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    run_main(main)
