#!/usr/bin/python3
"""One MNIST batch through psd.RemoteStage equals PyTorch's local
computation of the same batch (tests/it_py_exact.sh runs it).

    mnist_exact.py ADDR DATA_DIR LR

psd (configs/local.yaml: mnist_cnn, SGD lr LR, freshly started) trains one
batch of 32 training images twice:
  A. conv and fc as two RemoteStages with the images requiring a gradient:
     the log-probabilities, the loss, the images' gradient (conv's Backward
     with want_input_grad), every parameter's gradient (ctx.gradients(),
     GetGradients; on one psd also as the C client assembles its pages) and
     the weights after ctx.step() (GetParameters);
  B. the whole model as one RemoteStage(None), no input gradient: the
     Backward travels with the step (step=true); the loss and the weights
     after the step.
The reference is PyTorch autograd in float64 on the same weights
(psd.state_dict(client), i.e. GetParameters, loaded into the tutorial's Net
with load_state_dict(strict=True)) with the same dropout masks.

Dropout: psd draws its masks from a xoshiro256** stream seeded by
(context id's low 32 bits, trainer rank, seq) (docs/protocol.md, "Dropout
masks"); this test recomputes them here from that rule - one uniform per
(sample, channel) for Dropout2d(0.25), one per element for Dropout(0.5),
dropped when below p, kept ones scaled by 1/(1-p) - and applies them in
the reference. Dropout stays active, so the comparison covers psd's
dropout layers too. Tolerance: max |a - b| / (|b| + 1) <= 1e-5.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

import psd
from mnist_trainer import load_mnist

M64 = (1 << 64) - 1
TOL = 1e-5


def dropout_seed(ctx, rank, seq):
    z = ((ctx & 0xFFFFFFFF) * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019 + seq * 0xBF58476D1CE4E5B9
         + ((rank << 32) & M64) * 0xD6E8FEB86659FD93) & M64
    z ^= z >> 31
    return (z * 0x94D049BB133111EB) & M64


class Xoshiro:
    """xoshiro256** seeded through splitmix64, uniform() with 24 bits."""

    def __init__(self, seed):
        self.s = []
        for _ in range(4):
            seed = (seed + 0x9E3779B97F4A7C15) & M64
            z = seed
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
            self.s.append(z ^ (z >> 31))

    def uniform(self):
        s = self.s
        rot = lambda x, k: ((x << k) | (x >> (64 - k))) & M64  # noqa: E731
        result = (rot((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rot(s[3], 45)
        return (result >> 40) / 16777216.0


def masks(rng, n, count, p):
    keep = float(torch.tensor(1.0, dtype=torch.float32) / (1.0 - torch.tensor(p, dtype=torch.float32)))
    return torch.tensor([0.0 if rng.uniform() < p else keep for _ in range(n * count)],
                        dtype=torch.float64).reshape(n, count)


class Net(nn.Module):
    """The tutorial's Net (psd's mnist_cnn), dropout masks given."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x, m2d, m1d):
        x = F.max_pool2d(self.conv2(F.relu(self.conv1(x))), 2) * m2d[:, :, None, None]
        x = F.relu(self.fc1(torch.flatten(x, 1))) * m1d
        return F.log_softmax(self.fc2(x), dim=1)


def close(a, b, what):
    a, b = a.detach().double(), b.detach().double()
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} vs {tuple(b.shape)}"
    err = float(((a - b).abs() / (b.abs() + 1)).max())
    assert err <= TOL, f"{what}: max relative error {err:.3g} > {TOL}"
    return err


def reference(sd, x, y, m2d, m1d):
    net = Net().double()
    net.load_state_dict({k: v.double() for k, v in sd.items()}, strict=True)
    x = x.double().clone().requires_grad_(True)
    lp = net(x, m2d, m1d)
    loss = F.nll_loss(lp, y)
    loss.backward()
    return lp, loss, x.grad, {k: p.grad for k, p in net.named_parameters()}


def c_client_gradients(client, ctx_id):
    """Context ctx_id's gradients as the C client fetches them (every page
    of GetGradients, assembled: ps_client_get_gradients through
    test_service's PSD_DUMP_GRADIENTS; $BUILD, default build)."""
    prog = os.path.join(os.environ.get("BUILD", "build"), "tests", "test_service")
    assert os.path.exists(prog), f"{prog} (make all) fetches the gradients with the C client"
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "grads.safetensors")
        env = dict(os.environ, PSD_ADDR=client.single.server.address, PSD_DUMP_GRADIENTS=f"{ctx_id}:{out}")
        subprocess.run([prog], env=env, check=True, timeout=120)
        return read_safetensors(out)


def read_safetensors(path):
    """name -> float32 tensor of a safetensors file (its F32 tensors)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", (k, v["dtype"])
        a, b = v["data_offsets"]
        out[k] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(v["shape"])
    return out


def check_mnist(client, data, lr):
    """Both paths on mnist_cnn (one psd or conv and fc on two); returns the worst errors."""
    assert client.model == "mnist_cnn", client.model
    single = client.single is not None
    xs, ys = load_mnist(data, "train")
    worst = {}

    # A. two stages, the images' gradient asked for
    x, y = xs[:32].clone(), ys[:32]
    sd0 = psd.state_dict(client)
    conv, fc = psd.RemoteStage("conv", client), psd.RemoteStage("fc", client)
    xa = x.clone().requires_grad_(True)
    with psd.context(client) as ctx:
        lp = fc(conv(xa))
        loss = F.nll_loss(lp, y)
        loss.backward()
        grads = ctx.gradients()
        c_grads = c_client_gradients(client, ctx.id) if single else None   # before the step frees it
        res = ctx.step()
    m2d = masks(Xoshiro(dropout_seed(ctx.id, client.rank, 0)), 32, 64, 0.25)   # conv's Forward: seq 0
    m1d = masks(Xoshiro(dropout_seed(ctx.id, client.rank, 1)), 32, 128, 0.5)   # fc's: seq 1
    assert 0 < float((m2d == 0).double().mean()) < 0.5 and 0.3 < float((m1d == 0).double().mean()) < 0.7
    rlp, rloss, rgx, rgrads = reference(sd0, x, y, m2d, m1d)
    worst["log-probabilities"] = close(lp, rlp, "log-probabilities (fc's output)")
    worst["loss"] = close(loss, rloss, "loss")
    worst["input gradient"] = close(xa.grad, rgx, "d loss / d images (conv's Backward, want_input_grad)")
    assert sorted(grads) == sorted(rgrads), (sorted(grads), sorted(rgrads))
    for k in rgrads:
        worst[f"grad {k}"] = close(grads[k], rgrads[k], f"gradient of {k} (GetGradients)")
    if c_grads is not None:
        assert sorted(c_grads) == sorted(rgrads), (sorted(c_grads), sorted(rgrads))
        for k in rgrads:
            worst[f"C client grad {k}"] = close(c_grads[k], rgrads[k], f"gradient of {k} (C client's GetGradients)")
    assert res.version == 1 and not res.skipped and not res.partial, res
    sd1 = psd.state_dict(client)
    for k in sd0:
        worst[f"sgd {k}"] = close(sd1[k], sd0[k].double() - lr * rgrads[k], f"{k} after the step (SGD lr {lr})")
        assert not torch.equal(sd1[k], sd0[k]), f"{k} did not change"

    # B. the whole model as one RemoteStage: one Forward on one psd (its
    # Backward goes with the step), or conv and fc chained over two
    x, y = xs[32:64].clone(), ys[32:64]
    net = psd.RemoteStage(None, client)
    assert len(net.segments) == (1 if single else 2), net.segments
    with psd.context(client) as ctx:
        lp = net(x)
        loss = F.nll_loss(lp, y)
        loss.backward()
        assert ctx.pending, "no input gradient wanted: the Backward waits for the step"
        res = ctx.step()
    rng = Xoshiro(dropout_seed(ctx.id, client.rank, 0))     # one Forward: both dropouts from one stream
    m2d = masks(rng, 32, 64, 0.25)
    m1d = masks(rng if single else Xoshiro(dropout_seed(ctx.id, client.rank, 1)), 32, 128, 0.5)
    rlp, rloss, _, rgrads = reference(sd1, x, y, m2d, m1d)
    worst["whole-model log-probabilities"] = close(lp, rlp, "whole-model log-probabilities")
    worst["whole-model loss"] = close(loss, rloss, "whole-model loss")
    assert res.version == 2 and not res.partial, res
    sd2 = psd.state_dict(client)
    for k in sd1:
        worst[f"whole-model sgd {k}"] = close(sd2[k], sd1[k].double() - lr * rgrads[k], f"{k} after the second step")
    steps = 2
    if single:
        # C. one call a batch (RemoteStage.train_step): psd's cross-entropy
        # of the log-probabilities is the NLL, and its backward and step
        # those of B's three calls; the input needs no gradient
        x, y = xs[64:96].clone(), ys[64:96]
        with psd.context(client) as ctx:
            loss, res = net.train_step(x, y)
            assert ctx.state == "stepped" and not ctx.pending, ctx.state
        rng = Xoshiro(dropout_seed(ctx.id, client.rank, 0))
        m2d, m1d = masks(rng, 32, 64, 0.25), masks(rng, 32, 128, 0.5)
        _, rloss, _, rgrads = reference(sd2, x, y, m2d, m1d)
        worst["one-call loss"] = close(loss, rloss, "one call a batch: psd's loss")
        assert res.version == 3 and not res.skipped and not res.partial, res
        sd3 = psd.state_dict(client)
        for k in sd2:
            worst[f"one-call sgd {k}"] = close(sd3[k], sd2[k].double() - lr * rgrads[k], f"{k} after the one-call step")
            # the change itself, not only the weights: float32 rounding of w - lr g is ~1e-4 of the change
            want = -lr * rgrads[k]
            diff = float((sd3[k].double() - sd2[k].double() - want).abs().max() / want.abs().max())
            assert diff <= 2e-3, f"{k}: the one-call step changed it by {diff:.2e} of the change apart from PyTorch's"
        with psd.context(client):
            try:
                net.train_step(x.clone().requires_grad_(True), y)
                raise SystemExit("train_step accepted an input that requires a gradient")
            except psd.Error as e:
                assert "requires a gradient" in str(e), e
        with psd.context(client) as c3:   # not after other calls of the context
            lp = net(x)
            try:
                net.train_step(x, y)
                raise SystemExit("train_step ran after another call of its context")
            except psd.Error as e:
                assert "already ran other calls" in str(e), e
            F.nll_loss(lp, y).backward()
            c3.step()
        steps = 4
    st = client.status()
    versions = [st["model_version"]] if single else [s["model_version"] for s in st["servers"].values()]
    lives = [st["live_contexts"]] if single else [s["live_contexts"] for s in st["servers"].values()]
    assert versions == [steps] * len(versions) and lives == [0] * len(lives), st
    for k, v in worst.items():
        print(f"  {k:<36} max rel err {v:.2e}")
    where = "one psd" if single else f"conv on {client.stages['conv'].conn.name}, fc on {client.stages['fc'].conn.name}"
    print(f"mnist_exact ({where}): loss {float(rloss):.6f}, input and parameter gradients, dropout masks and "
          f"{'the three' if single else 'both'} SGD steps{' (the third one call a batch)' if single else ''} equal "
          f"PyTorch's (max rel err {max(worst.values()):.1e} <= {TOL}): OK")
    return worst


def main():
    addr, data, lr = sys.argv[1], sys.argv[2], float(sys.argv[3])
    torch.set_num_threads(1)
    check_mnist(psd.connect(addr, rank=1), data, lr)


if __name__ == "__main__":
    main()
