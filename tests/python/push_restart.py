#!/usr/bin/python3
"""tests/it_push_lost.sh's trainer: rnn_lm's decoder and the trainer-run LSTM
(psd.HostedModule, stage "rnn") on one psd, which is SIGKILLed and
restarted between a batch's decoder Backward and its Step.

    push_restart.py ADDR GO_FILE

1. A batch is applied (sanity).
2. A batch runs its LSTM here and its decoder on psd (the Backward with the
   input gradient goes at once), prints READY and waits for GO_FILE (the
   shell restarts psd meanwhile). Its ctx.step() pushes the LSTM's
   gradients with PushGradientsRequest.context_known (the decoder's
   Forward opened the context there): the restarted psd answers NOT_FOUND,
   so the step is psd.ContextLost - not applied with the LSTM's gradients
   alone while the decoder's died with psd.
3. The wire rule on the restarted psd: context_known (PushGradients, and a
   Forward's) on an unknown context is NOT_FOUND; without it (an older
   client) a push opens the context, as before (this one is then stepped:
   one context applied).
4. The same batch under psd.attempts: run again, applied.
Prints the lines the shell checks; exits non-zero on any failure.
"""
import os
import sys
import time

import grpc
import torch
import torch.nn as nn
import torch.nn.functional as F

import psd
from psd._proto import ps_pb2
from psd.tensors import to_wire


def batch(dec, lstm, x, y):
    h, _ = lstm(x)
    return F.cross_entropy(dec(h).reshape(-1, dec_classes), y.reshape(-1))


def main():
    global dec_classes
    addr, go = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    client = psd.connect(addr, overrides={"trainer.rpc_timeout_s": "10", "trainer.retry_max_s": "60",
                                          "trainer.retry_backoff_s": "0.1", "trainer.retry_backoff_max_s": "0.5"})
    shapes = {p["name"]: p["shape"] for p in client.parameters}
    nhid, ninp = shapes["rnn.weight_hh_l0"][1], shapes["rnn.weight_ih_l0"][1]
    nlayers = sum(1 for n in shapes if n.startswith("rnn.weight_ih_l"))
    dec_classes = shapes["decoder.weight"][0]
    dec = psd.RemoteStage("decoder", client)
    lstm = psd.HostedModule(nn.LSTM(ninp, nhid, nlayers), "rnn", client)
    x = torch.randn(5, 3, ninp)                  # (seq, batch, ninp): the LSTM's input, made here
    y = torch.randint(0, dec_classes, (5, 3))

    with psd.context(client) as ctx:             # 1. applied
        batch(dec, lstm, x, y).backward()
        print(f"batch 1 applied: version {ctx.step().version}", flush=True)

    with psd.context(client) as ctx:             # 2. psd restarts before the step
        batch(dec, lstm, x, y).backward()        # the decoder's Backward: on psd now
        print(f"READY {ctx.id:x}", flush=True)
        while not os.path.exists(go):
            time.sleep(0.05)
        try:
            r = ctx.step()
            sys.exit(f"push_restart: the step after the restart was applied (version {r.version}) with the LSTM's "
                     "gradients alone: the decoder's died with psd")
        except psd.ContextLost as e:
            assert "context_known" in str(e), e
            print(f"batch 2 lost: {e}", flush=True)

    conn = client.conns[0]                       # 3. the wire rule on the restarted psd
    grads = [to_wire(torch.zeros(shapes[n]), n) for n in shapes if n.startswith("rnn.")]
    cid = client.ids.next()
    req = ps_pb2.PushGradientsRequest(context_id=cid, trainer_rank=client.rank, gradients=grads, context_known=True)
    try:
        conn.call("PushGradients", req)
        sys.exit("push_restart: PushGradients with context_known opened an unknown context")
    except psd.Error as e:
        assert e.code == grpc.StatusCode.NOT_FOUND and "context_known" in e.details, e
    fwd = ps_pb2.ForwardRequest(context_id=client.ids.next(), train=True, seq=1, stage="decoder",
                                trainer_rank=client.rank, input=to_wire(torch.zeros(2, 3, nhid)), context_known=True)
    try:                                         # a Forward retried in place after a restart: the same rule
        conn.call("Forward", fwd)
        sys.exit("push_restart: a Forward with context_known opened an unknown context")
    except psd.Error as e:
        assert e.code == grpc.StatusCode.NOT_FOUND and "ForwardRequest.context_known" in e.details, e
    req.context_known = False
    conn.call("PushGradients", req)              # an older client's push opens it, as before
    conn.call("Step", ps_pb2.StepRequest(context_id=cid))
    print("wire: context_known (PushGradients, Forward) on an unknown context NOT_FOUND; without it opened (older "
          "clients)", flush=True)

    runs = 0
    for ctx in psd.attempts(client):             # 4. the batch again: applied
        with ctx:
            runs += 1
            batch(dec, lstm, x, y).backward()
            r = ctx.step()
    print(f"batch 2 again: applied, version {r.version}, {runs} run(s)", flush=True)


if __name__ == "__main__":
    try:
        main()
    except psd.Error as e:
        sys.exit(f"push_restart: {e}")
