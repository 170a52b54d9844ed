#!/usr/bin/python3
"""Write tests/golden/mnist_step.safetensors: two SGD steps of the MNIST CNN
from PyTorch's RPC parameter-server tutorial, computed by PyTorch in float32,
for the C code to be checked against.

Regenerate (needs PyTorch; Debian's python3-torch 1.13 is what made the
committed file):

    /usr/bin/python3 scripts/gen_golden.py [output path]

The C tests only read the committed file; they do not need PyTorch or Python.
The safetensors file is written with Python's struct and json only (the
`safetensors` package is not used), and the script re-reads it the same way
and replays both steps from the stored tensors to check that they reproduce
the stored outputs, gradients and final weights bit for bit.

Network (pytorch/tutorials intermediate_source/rpc_param_server_tutorial.rst,
= pytorch/examples distributed/rpc/parameter_server/rpc_parameter_server.py):

    x (N,1,28,28) -> conv1 = Conv2d(1, 32, 3, stride 1)   -> (N,32,26,26)
                  -> relu
                  -> conv2 = Conv2d(32, 64, 3, stride 1)  -> (N,64,24,24)
                     (no relu after conv2 in the tutorial's Net)
                  -> max_pool2d(2)                        -> (N,64,12,12)
                  -> dropout1 = Dropout2d(p=0.25): x * mask1[:, :, None, None]
                                                          -> (N,64,12,12)
                  -> flatten                              -> (N,9216)
                  -> fc1 = Linear(9216, 128)              -> (N,128)
                  -> relu
                  -> dropout2 (p=0.5): x * mask2          -> (N,128)
                  -> fc2 = Linear(128, 10)                -> (N,10)
                  -> log_softmax(dim=1)                   -> output (N,10)
    loss = nll_loss(output, target), mean over the batch

Dropout is made reproducible from the file: instead of the modules, explicit
masks mask = bernoulli(1-p) / (1-p) (values 0 or 1/(1-p) in float32) are
drawn with torch and applied by multiplying; they are stored. The tutorial's
modules are nn.Dropout2d: the first acts on the 4-D conv output and drops
whole channels, so mask1 is one value per (sample, channel), (N,64), spread
over the channel's 12x12 plane (what nn.Dropout2d does); the second acts on
(N,128), where nn.Dropout2d drops single elements, so mask2 is (N,128).

Randomness, in this order, from torch.manual_seed(0): the modules' default
initialisation (conv1, conv2, fc1, fc2 constructed in that order), then for
each step: input = (torch.rand(N,1,28,28) - 0.1307) / 0.3081,
target = torch.randint(0, 10, (N,)), mask1, mask2.

Optimizer: torch.optim.SGD(lr=0.03, momentum=0.9, weight_decay=1e-4)
(dampening 0, no Nesterov), one step after each backward.

Tensors (P = conv1.weight, conv1.bias, conv2.weight, conv2.bias, fc1.weight,
fc1.bias, fc2.weight, fc2.bias, PyTorch's state_dict names), all F32 except
the I64 targets:
    init.<P>                weights before step 1
    stepK.input             (N,1,28,28)   K = 1, 2
    stepK.target            (N,) I64
    stepK.mask1             (N,64) one value per channel
    stepK.mask2             (N,128)
    stepK.output            (N,10) log-probabilities
    stepK.loss              (1,)
    stepK.grad_output       (N,10) d loss / d output (-1/N at the target)
    stepK.grad.<P>          gradients of step K (step 2's with the weights
                            after step 1)
    final.<P>               weights after the second optimizer step
__metadata__ holds the hyper-parameters, the layer sequence and versions.
"""
import json
import os
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8
LR, MOMENTUM, WEIGHT_DECAY = 0.03, 0.9, 1e-4
P1, P2 = 0.25, 0.5
SEED = 0
LAYERS = ("conv1=Conv2d(1,32,3,1); relu; conv2=Conv2d(32,64,3,1); max_pool2d(2); "
          "dropout1=Dropout2d(p=0.25, x*mask1[:,:,None,None]); flatten(1); fc1=Linear(9216,128); relu; "
          "dropout2(p=0.5, x*mask2); fc2=Linear(128,10); log_softmax(dim=1)")
PARAMS = ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
          "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]

DEFAULT_OUT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                           "tests", "golden", "mnist_step.safetensors"))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x, mask1, mask2):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.max_pool2d(x, 2)
        x = x * mask1[:, :, None, None]
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = x * mask2
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def make_batch():
    inp = (torch.rand(BATCH, 1, 28, 28) - 0.1307) / 0.3081
    target = torch.randint(0, 10, (BATCH,), dtype=torch.int64)
    mask1 = torch.bernoulli(torch.full((BATCH, 64), 1 - P1)) / (1 - P1)
    mask2 = torch.bernoulli(torch.full((BATCH, 128), 1 - P2)) / (1 - P2)
    return inp, target, mask1, mask2


def train_step(net, opt, inp, target, mask1, mask2):
    """One forward/backward/SGD step; returns the tensors to store."""
    opt.zero_grad()
    out = net(inp, mask1, mask2)
    out.retain_grad()
    loss = F.nll_loss(out, target)
    loss.backward()
    rec = {
        "output": out.detach().clone(),
        "loss": loss.detach().reshape(1).clone(),
        "grad_output": out.grad.detach().clone(),
    }
    params = dict(net.named_parameters())
    for p in PARAMS:
        rec["grad." + p] = params[p].grad.detach().clone()
    opt.step()
    return rec


def make_opt(net):
    return torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM,
                           weight_decay=WEIGHT_DECAY)


def snapshot(net, prefix):
    sd = net.state_dict()
    return {prefix + p: sd[p].detach().clone() for p in PARAMS}


# --- safetensors with struct + json only -----------------------------------

DTYPES = {torch.float32: ("F32", 4), torch.int64: ("I64", 8)}
# The reference implementation orders data by dtype (descending in its enum,
# where I64 > F64 > F32), then by name; that keeps every tensor aligned.
DTYPE_RANK = {"I64": 0, "F64": 1, "F32": 2}


def write_safetensors(path, tensors, metadata):
    items = []
    for name, t in tensors.items():
        code, _ = DTYPES[t.dtype]
        items.append((DTYPE_RANK[code], name, code, t.contiguous()))
    items.sort(key=lambda it: (it[0], it[1]))
    header = {"__metadata__": metadata}
    blobs, pos = [], 0
    for _, name, code, t in items:
        b = t.numpy().tobytes()  # native order; checked little-endian below
        header[name] = {"dtype": code, "shape": list(t.shape),
                        "data_offsets": [pos, pos + len(b)]}
        blobs.append(b)
        pos += len(b)
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((8 - len(hj) % 8) % 8)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert 8 + n <= len(raw) and n % 8 == 0, "bad header length"
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
    pos = 0
    for b, e, k in spans:
        assert b == pos, f"{k}: offsets not contiguous"
        pos = e
    assert pos == len(data), "data buffer not covered exactly"
    out = {}
    for k, v in header.items():
        dt = {"F32": torch.float32, "I64": torch.int64}[v["dtype"]]
        b, e = v["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:e]), dtype=dt) if e > b else torch.empty(0, dtype=dt)
        out[k] = t.reshape(v["shape"])
    return out, meta


# --- main ------------------------------------------------------------------

def generate():
    torch.manual_seed(SEED)
    net = Net()
    opt = make_opt(net)
    tensors = snapshot(net, "init.")
    for k in (1, 2):
        inp, target, mask1, mask2 = make_batch()
        tensors.update({f"step{k}.input": inp, f"step{k}.target": target,
                        f"step{k}.mask1": mask1, f"step{k}.mask2": mask2})
        rec = train_step(net, opt, inp, target, mask1, mask2)
        tensors.update({f"step{k}.{n}": t for n, t in rec.items()})
    tensors.update(snapshot(net, "final."))
    return tensors


def self_check(path, expected_names):
    got, meta = read_safetensors(path)
    assert set(got) == set(expected_names), "tensor names differ after re-reading"
    assert meta["layers"] == LAYERS
    shapes = {"step1.input": (BATCH, 1, 28, 28), "step1.target": (BATCH,),
              "step1.mask1": (BATCH, 64), "step1.mask2": (BATCH, 128),
              "step1.output": (BATCH, 10), "step1.loss": (1,),
              "step1.grad_output": (BATCH, 10), "init.fc1.weight": (128, 9216),
              "final.conv2.weight": (64, 32, 3, 3), "step2.grad.fc2.bias": (10,)}
    for name, shape in shapes.items():
        assert tuple(got[name].shape) == shape, f"{name}: shape {tuple(got[name].shape)}"
    # Replay both steps from the stored tensors alone.
    net = Net()
    net.load_state_dict({p: got["init." + p] for p in PARAMS})
    opt = make_opt(net)
    for k in (1, 2):
        s = f"step{k}."
        rec = train_step(net, opt, got[s + "input"], got[s + "target"],
                         got[s + "mask1"], got[s + "mask2"])
        for n, t in rec.items():
            assert torch.equal(t, got[s + n]), f"replay: {s + n} differs"
    sd = net.state_dict()
    for p in PARAMS:
        assert torch.equal(sd[p], got["final." + p]), f"replay: final.{p} differs"
    g = got["step1.grad_output"]
    assert torch.all(g.sum(1) == -1.0 / BATCH) and torch.count_nonzero(g) == BATCH
    return got


def main():
    assert sys.byteorder == "little"
    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUT
    torch.set_num_threads(1)  # fixed reduction order: same bits on every run
    torch.use_deterministic_algorithms(True)
    tensors = generate()
    for name, t in tensors.items():
        assert t.dtype in DTYPES, f"{name}: {t.dtype}"
    metadata = {
        "format": "psd golden step v1",
        "generator": "scripts/gen_golden.py",
        "layers": LAYERS,
        "params": ",".join(PARAMS),
        "seed": str(SEED),
        "batch": str(BATCH),
        "steps": "2",
        "lr": repr(LR),
        "momentum": repr(MOMENTUM),
        "weight_decay": repr(WEIGHT_DECAY),
        "dampening": "0",
        "nesterov": "false",
        "dropout1_p": repr(P1),
        "dropout2_p": repr(P2),
        "dropout": "explicit masks, mask = bernoulli(1-p)/(1-p): mask1 per channel (Dropout2d), "
                   "mask2 per element",
        "input": "(torch.rand(N,1,28,28) - 0.1307) / 0.3081",
        "loss": "nll_loss(output, target), mean",
        "dtype": "float32 (targets int64)",
        "torch_version": torch.__version__,
    }
    write_safetensors(path, tensors, metadata)
    got = self_check(path, tensors.keys())
    print(f"wrote {path}: {len(tensors)} tensors, {os.path.getsize(path)} bytes; "
          f"loss1 {got['step1.loss'].item():.6f} loss2 {got['step2.loss'].item():.6f}; "
          "self-check passed")


if __name__ == "__main__":
    main()
