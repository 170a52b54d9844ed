#!/usr/bin/python3
"""Two windows of rnn_lm through python/psd equal PyTorch's local
computation (run by tests/python/exact.py, from tests/it_py_exact.sh).

psd hosts rnn_lm with dropout 0 (model.sizes.dropout; the masks are covered
by the MNIST check), on one psd or a cluster (encoder.weight sharded by rows
over two servers, decoder and rnn on a third). The trainer's nn.LSTM is a
psd.HostedModule; each window: emb (RemoteStage; a sharded table gets each
shard's ids) -> LSTM here -> decoder:
  1. psd's fused loss (RemoteStage.cross_entropy), ctx.clip_grad_norm_ over
     every parameter (the norm summed from every touched server's reply and
     the pushed LSTM gradients): the loss, the norm, every gradient
     (ctx.gradients(), the table put back together from its shards) and the
     clipped SGD step of every parameter (state_dict), rows the window did
     not touch unchanged;
  2. the logits here and the loss here (the tutorial's design), a step with
     grad_scale 0.5; the LSTM's weights fetched again because psd's version
     moved on.
The reference: PyTorch autograd in float64 (Embedding, LSTM, Linear, the
mean cross-entropy) on psd's weights before the window (psd.state_dict).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import psd
from mnist_exact import TOL, close


def reference(sd, ids, tgt, h0):
    """(loss, {name: gradient}) in float64."""
    w = {k: v.double().clone().requires_grad_(True) for k, v in sd.items()}
    nlayers = sum(1 for k in sd if k.startswith("rnn.weight_hh_l"))
    ninp, nhid = sd["encoder.weight"].shape[1], sd["rnn.weight_hh_l0"].shape[1]
    lstm = nn.LSTM(ninp, nhid, nlayers).double()
    for n, p in list(lstm.named_parameters()):   # the reference LSTM's parameters are psd's, as leaves of w
        del lstm._parameters[n]
        setattr(lstm, n, w[f"rnn.{n}"])
    lstm._flat_weights = [getattr(lstm, n) for n in lstm._flat_weights_names]
    out, _ = lstm(F.embedding(ids, w["encoder.weight"]), tuple(h.double() for h in h0))
    logits = F.linear(out, w["decoder.weight"], w["decoder.bias"])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
    loss.backward()
    return loss, {k: v.grad if v.grad is not None else torch.zeros_like(v) for k, v in w.items()}


def check_lm(client, lr, clip=0.05):
    assert client.model == "rnn_lm", client.model
    sd0 = psd.state_dict(client)
    ntoken, ninp = sd0["encoder.weight"].shape
    nlayers = sum(1 for k in sd0 if k.startswith("rnn.weight_hh_l"))
    nhid = sd0["rnn.weight_hh_l0"].shape[1]
    emb, dec = psd.RemoteStage("emb", client), psd.RemoteStage("decoder", client)
    rnn = psd.HostedModule(nn.LSTM(ninp, nhid, nlayers), "rnn", client)
    g = torch.Generator().manual_seed(3)
    T, N = 6, 4
    worst = {}
    shards = client.stages["emb"].shards
    steps = []
    for window in (1, 2):
        ids = torch.randint(0, ntoken, (T, N), generator=g)
        tgt = torch.randint(0, ntoken, (T, N), generator=g)
        h0 = (0.1 * torch.randn(nlayers, N, nhid, generator=g), 0.1 * torch.randn(nlayers, N, nhid, generator=g))
        for _, lo, hi in shards:
            assert bool(((ids >= lo) & (ids < hi)).any()), f"window {window}: no id in shard rows [{lo}, {hi})"
        sd = psd.state_dict(client)
        with psd.context(client) as ctx:
            out, _ = rnn(emb(ids), h0)
            if window == 1:
                loss = dec.cross_entropy(out, tgt)
                loss.backward()
                norm = float(ctx.clip_grad_norm_(clip))
                grads = ctx.gradients()
                res = ctx.step()
            else:
                logits = dec(out)
                loss = F.cross_entropy(logits.reshape(-1, ntoken), tgt.reshape(-1))
                loss.backward()
                res = ctx.step(grad_scale=0.5)
        assert rnn.pulls == window, f"the LSTM's weights were fetched {rnn.pulls} times for {window} windows"
        rloss, rgrads = reference(sd, ids, tgt, h0)
        worst[f"w{window} loss"] = close(loss, rloss, f"window {window} loss")
        if window == 1:
            rnorm = math.sqrt(sum(float((v ** 2).sum()) for v in rgrads.values()))
            worst["w1 global norm"] = close(torch.tensor(norm), torch.tensor(rnorm), "clip_grad_norm_'s total norm")
            scale = clip / (rnorm + 1e-6)
            assert scale < 1, f"norm {rnorm} does not exceed clip {clip}: the clip is not exercised"
            assert sorted(grads) == sorted(rgrads), (sorted(grads), sorted(rgrads))
            for k in rgrads:
                worst[f"w1 grad {k}"] = close(grads[k], rgrads[k], f"window 1 gradient of {k}")
        else:
            scale = 0.5
        assert not res.partial and res.version >= window, res
        after = psd.state_dict(client)
        for k in sd:
            worst[f"w{window} sgd {k}"] = close(after[k], sd[k].double() - lr * scale * rgrads[k],
                                                f"window {window}: {k} after the step")
        untouched = torch.ones(ntoken, dtype=torch.bool)
        untouched[ids.reshape(-1)] = False
        assert torch.equal(after["encoder.weight"][untouched], sd["encoder.weight"][untouched]), \
            "rows the window did not touch changed"
        steps.append(res.version)
    for k, v in worst.items():
        print(f"  {k:<36} max rel err {v:.2e}")
    where = "one psd" if client.single is not None else \
        f"emb rows on {', '.join(f'{c.name} [{a}, {b})' for c, a, b in shards)}, decoder and rnn on " \
        f"{client.stages['decoder'].conn.name}"
    print(f"lm_exact ({where}): fused loss with the global-norm clip, then logits here with grad_scale 0.5: "
          f"losses, norm, gradients and steps equal PyTorch's (max rel err {max(worst.values()):.1e} <= {TOL}): OK")
    return worst
