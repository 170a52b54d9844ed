#!/usr/bin/python3
"""psd under optimizer.type adam, end to end (tests/it_adam.sh runs it).

rnn_lm (ntoken 50, ninp = nhid = 8, dropout 0): each step is one context
with a Forward of ids through stage emb and of a fake RNN output h through
stage decoder, a Backward of each with random output gradients, and a Step.
After every step the weights psd serves must equal an independent float64
numpy run of torch.optim.Adam (decoder.weight, decoder.bias) and
torch.optim.SparseAdam (encoder.weight: only the rows the ids hit change,
one step count for the table) within 1e-5.

    adam_client.py ADDR FIRST LAST STATE

runs steps FIRST..LAST-1. FIRST 0 starts the reference from the weights psd
serves; otherwise the reference (weights and Adam state) is read from STATE
and psd's weights must already equal it - the test restarts psd from its
checkpoint in between, so the steps after the restart only match when the
checkpoint brought back exp_avg, exp_avg_sq and the step counts. The
reference is written back to STATE at the end.
"""
import pickle
import sys

import grpc
import numpy as np

import ps_pb2
import ps_pb2_grpc
from generic_client import array, params, tensor  # noqa: F401 (array: used by params)

LR, B1, B2, EPS = 0.01, 0.9, 0.999, 1e-8


def adam(w, g, s):
    """torch.optim.Adam (amsgrad off, no weight decay) on w, float64."""
    s["t"] += 1
    t = s["t"]
    s["m"] = B1 * s["m"] + (1 - B1) * g
    s["v"] = B2 * s["v"] + (1 - B2) * g * g
    return w - LR / (1 - B1 ** t) * s["m"] / (np.sqrt(s["v"] / (1 - B2 ** t)) + EPS)


def sparse_adam(w, g, rows, s):
    """torch.optim.SparseAdam: moments and weights of the given rows only."""
    s["t"] += 1
    t = s["t"]
    w = w.copy()
    s["m"][rows] = B1 * s["m"][rows] + (1 - B1) * g[rows]
    s["v"][rows] = B2 * s["v"][rows] + (1 - B2) * g[rows] ** 2
    w[rows] -= LR * np.sqrt(1 - B2 ** t) / (1 - B1 ** t) * s["m"][rows] / (np.sqrt(s["v"][rows]) + EPS)
    return w


def main():
    addr, first, last, state_path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    channel = grpc.insecure_channel(addr)
    grpc.channel_ready_future(channel).result(timeout=30)
    stub = ps_pb2_grpc.ParameterServerStub(channel)
    w, version = params(stub)
    if first == 0:
        ref = {k: v.astype(np.float64) for k, v in w.items()}
        st = {k: {"t": 0, "m": np.zeros_like(v), "v": np.zeros_like(v)} for k, v in ref.items()}
    else:
        with open(state_path, "rb") as f:
            ref, st = pickle.load(f)
        assert version == first, f"psd resumed at version {version}, want {first}"
        for k in w:
            assert np.abs(w[k] - ref[k]).max() < 1e-5, f"{k} after the restart differs from the reference"
    prev = w["encoder.weight"]
    for k in range(first, last):
        rng = np.random.default_rng(100 + k)
        ids = rng.integers(0, 10, (3, 2)).astype(np.int64) * 2   # rows 0, 2, ..., 18 of 50
        h = rng.standard_normal((3, 2, 8)).astype(np.float32)
        g_out = rng.standard_normal((3, 2, 50)).astype(np.float32)
        g_emb = rng.standard_normal((3, 2, 8)).astype(np.float32)
        ctx = 0x3000000 + k
        stub.Forward(ps_pb2.ForwardRequest(context_id=ctx, seq=0, train=True, trainer_rank=1,
                                           input=tensor(ids, ps_pb2.INT64), stage="emb"))
        stub.Forward(ps_pb2.ForwardRequest(context_id=ctx, seq=1, train=True, trainer_rank=1, input=tensor(h),
                                           stage="decoder"))
        stub.Backward(ps_pb2.BackwardRequest(context_id=ctx, seq=1, grad_output=tensor(g_out)))
        stub.Backward(ps_pb2.BackwardRequest(context_id=ctx, seq=0, grad_output=tensor(g_emb)))
        s = stub.Step(ps_pb2.StepRequest(context_id=ctx))
        assert s.model_version == k + 1 and not s.skipped, (s.model_version, s.skipped)
        g_enc = np.zeros_like(ref["encoder.weight"])
        np.add.at(g_enc, ids.reshape(-1), g_emb.reshape(-1, 8).astype(np.float64))
        ref["decoder.weight"] = adam(ref["decoder.weight"], np.einsum("sbo,sbi->oi", g_out, h).astype(np.float64),
                                     st["decoder.weight"])
        ref["decoder.bias"] = adam(ref["decoder.bias"], g_out.sum(axis=(0, 1)).astype(np.float64), st["decoder.bias"])
        ref["encoder.weight"] = sparse_adam(ref["encoder.weight"], g_enc, np.unique(ids), st["encoder.weight"])
        w, _ = params(stub)
        for n in w:
            err = np.abs(w[n] - ref[n]).max()
            assert err < 1e-5, f"step {k}: {n} off by {err} from numpy's Adam/SparseAdam"
        untouched = np.setdiff1d(np.arange(50), np.unique(ids))
        assert np.array_equal(w["encoder.weight"][untouched], prev[untouched]), "rows not hit must keep their bits"
        prev = w["encoder.weight"]
    with open(state_path, "wb") as f:
        pickle.dump((ref, st), f)
    print(f"adam steps {first}..{last - 1}: OK")


if __name__ == "__main__":
    main()
