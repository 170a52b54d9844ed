#!/usr/bin/python3
"""Write tests/golden/optim_steps.safetensors: optimizer steps computed by
PyTorch's own optimizers in float32 on given gradients, for
tests/test_optim.c to check common/nn/optim.c (every CPU backend) against.

Regenerate (needs PyTorch; Debian's python3-torch 1.13 made the committed
file):

    /usr/bin/python3 scripts/gen_golden_optim.py [output path]

The C test only reads the committed file. The file is written with Python's
struct and json only (as scripts/gen_golden.py does), re-read the same way,
and every case is replayed from the stored tensors to check it reproduces
the stored results bit for bit.

Cases (prefix, optimizer, parameters, steps):

  adam.     torch.optim.Adam(lr=0.01, betas=(0.8, 0.99), eps=1e-6,
            weight_decay=0.05, foreach=False), parameters p0 (12, 25) and
            p1 (40,), 4 steps. Gradients include exact zeros.
  adamdef.  torch.optim.Adam(lr=1e-3) (betas (0.9, 0.999), eps 1e-8, no
            weight decay), p0 (12, 25), 3 steps; gradients spanning 1e-9 to
            1 so that eps matters for some elements.
  sgd.      torch.optim.SGD(lr=0.05, momentum=0.9, weight_decay=0.01), p0
            (12, 25), 3 steps.
  sadam.    torch.optim.SparseAdam(lr=0.01, betas=(0.9, 0.999), eps=1e-4) on
            an embedding table emb (30, 8), 4 steps with sparse row
            gradients (distinct rows per step, unsorted, some rows touched
            in several steps, some never; magnitudes 1e-6 to 1 so that
            where eps enters - unscaled, unlike Adam's - matters).
  ssgd.     torch.optim.SGD(lr=0.1) with the same kind of sparse row
            gradients on emb (30, 8), 3 steps.

Tensors, F32 unless said (K = 1.. steps, P = parameter name):
  <case>init.<P>              weights before step 1
  <case>stepK.grad.<P>        dense cases: the gradient of step K
  <case>stepK.rows            sparse cases: I64 (n,) touched rows, as given
  <case>stepK.grad_rows       sparse cases: (n, 8) their gradient rows
  <case>stepK.<P>             weights after step K
  <case>stepK.<state>.<P>     the optimizer state after step K under
                              PyTorch's state keys (exp_avg, exp_avg_sq,
                              momentum_buffer)
Metadata: each case's hyper-parameters as "<case>lr" etc. (repr of the
Python float), "<case>steps", "<case>params", and the torch version.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_golden import read_safetensors, write_safetensors  # noqa: E402  (struct + json only)

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden",
                           "optim_steps.safetensors")
SEED = 0

CASES = {
    "adam.": dict(cls="Adam", kw=dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05,
                                      foreach=False),
                  params={"p0": (12, 25), "p1": (40,)}, steps=4, sparse=False),
    "adamdef.": dict(cls="Adam", kw=dict(lr=1e-3, foreach=False),
                     params={"p0": (12, 25)}, steps=3, sparse=False),
    "sgd.": dict(cls="SGD", kw=dict(lr=0.05, momentum=0.9, weight_decay=0.01),
                 params={"p0": (12, 25)}, steps=3, sparse=False),
    "sadam.": dict(cls="SparseAdam", kw=dict(lr=0.01, betas=(0.9, 0.999), eps=1e-4),
                   params={"emb": (30, 8)}, steps=4, sparse=True),
    "ssgd.": dict(cls="SGD", kw=dict(lr=0.1), params={"emb": (30, 8)}, steps=3, sparse=True),
}
# Touched rows per sparse step (distinct, unsorted; rows 25..29 never touched).
SPARSE_ROWS = [[3, 0, 17, 9], [9, 4, 3, 22, 11, 5], [20], [17, 3, 24, 0, 1, 2, 8]]


def dense_grad(case, k, shape):
    g = torch.randn(shape)
    if case == "adamdef.":  # magnitudes from 1e-9 to 1: eps matters for the small ones
        g = g * torch.pow(10.0, -torch.randint(0, 10, shape).float())
    flat = g.view(-1)
    flat[::7] = 0.0  # exact zeros
    return g


def run_case(case, spec, tensors):
    params = {n: torch.randn(s) * 0.5 for n, s in spec["params"].items()}
    for n, p in params.items():
        tensors[f"{case}init.{n}"] = p.clone()
    ps = {n: torch.nn.Parameter(p.clone()) for n, p in params.items()}
    opt = getattr(torch.optim, spec["cls"])(list(ps.values()), **spec["kw"])
    for k in range(1, spec["steps"] + 1):
        s = f"{case}step{k}."
        for n, p in ps.items():
            if spec["sparse"]:
                rows = torch.tensor(SPARSE_ROWS[k - 1], dtype=torch.int64)
                vals = torch.randn(len(rows), p.shape[1])
                if spec["cls"] == "SparseAdam":
                    vals = vals * torch.pow(10.0, -torch.randint(0, 7, vals.shape).float())
                tensors[s + "rows"] = rows
                tensors[s + "grad_rows"] = vals
                p.grad = torch.sparse_coo_tensor(rows.view(1, -1), vals, p.shape)
            else:
                g = dense_grad(case, k, p.shape)
                tensors[f"{s}grad.{n}"] = g
                p.grad = g.clone()
        opt.step()
        for n, p in ps.items():
            tensors[f"{s}{n}"] = p.detach().clone()
            for key, v in opt.state[p].items():
                if key == "step" or v is None:  # SGD without momentum keeps None
                    continue
                tensors[f"{s}{key}.{n}"] = v.detach().clone()
    return ps, opt


def self_check(path, tensors):
    """Replay every case from the stored tensors alone; results must be bit-identical."""
    got, _ = read_safetensors(path)
    assert set(got) == set(tensors), "tensor names differ after re-reading"
    for case, spec in CASES.items():
        ps = {n: torch.nn.Parameter(got[f"{case}init.{n}"].clone()) for n in spec["params"]}
        opt = getattr(torch.optim, spec["cls"])(list(ps.values()), **spec["kw"])
        for k in range(1, spec["steps"] + 1):
            s = f"{case}step{k}."
            for n, p in ps.items():
                if spec["sparse"]:
                    p.grad = torch.sparse_coo_tensor(got[s + "rows"].view(1, -1), got[s + "grad_rows"], p.shape)
                else:
                    p.grad = got[f"{s}grad.{n}"].clone()
            opt.step()
            for n, p in ps.items():
                assert torch.equal(p.detach(), got[f"{s}{n}"]), f"replay: {s}{n} differs"
    # Lazy semantics: rows SparseAdam never touched keep their initial values.
    untouched = [r for r in range(30) if all(r not in rows for rows in SPARSE_ROWS)]
    last = CASES["sadam."]["steps"]
    assert torch.equal(got[f"sadam.step{last}.emb"][untouched], got["sadam.init.emb"][untouched])


def main():
    assert sys.byteorder == "little"
    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUT
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    tensors = {}
    metadata = {"format": "psd golden optimizer steps v1", "generator": "scripts/gen_golden_optim.py",
                "torch_version": torch.__version__, "seed": str(SEED)}
    for case, spec in CASES.items():
        run_case(case, spec, tensors)
        kw = dict(spec["kw"])
        kw.pop("foreach", None)
        betas = kw.pop("betas", None)
        if betas is not None or spec["cls"] in ("Adam", "SparseAdam"):
            b1, b2 = betas if betas is not None else (0.9, 0.999)
            kw["beta1"], kw["beta2"] = b1, b2
            kw.setdefault("eps", 1e-8)
        kw.setdefault("momentum", 0.0)
        kw.setdefault("weight_decay", 0.0)
        for key, v in kw.items():
            metadata[case + key] = repr(float(v))
        metadata[case + "class"] = "torch.optim." + spec["cls"]
        metadata[case + "steps"] = str(spec["steps"])
        metadata[case + "params"] = ",".join(spec["params"])
    write_safetensors(path, tensors, metadata)
    self_check(path, tensors)
    print(f"wrote {path}: {len(tensors)} tensors, {os.path.getsize(path)} bytes; self-check passed")


if __name__ == "__main__":
    main()
