#!/usr/bin/python3
"""hostile_ctx.py - the context memory budget against a greedy client, for
tests/it_hostile.sh. Python grpcio with stubs generated from proto/ps.proto
at test time (PYTHONPATH); psd must run mnist_cnn with tokens "hog" and
"good" and a small server.max_context_bytes.

  hostile_ctx.py ADDR PSD_PID HOG_TOKEN GOOD_TOKEN MAX_BYTES

1. The hog opens contexts with training Forwards (batch 64) and never steps
   them, up to 400 (bounded): it must be refused RESOURCE_EXHAUSTED naming
   server.max_context_bytes once it holds the budget, and Status.context_bytes
   must never exceed MAX_BYTES;
2. the good client (another token) then trains 5 batches (Forward, Backward
   with step) although the hog holds the whole budget: psd makes room by
   evicting the hog's idle contexts (Status.contexts_evicted grows);
3. psd's RSS grew by less than a loose bound (MAX_BYTES plus 300 MiB).
"""
import sys
import time

import grpc
import numpy as np

import ps_pb2
import ps_pb2_grpc
from hostile import rss_mb  # tests/hostile.py


def main():
    addr, pid, hog_tok, good_tok, max_bytes = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
    ch = grpc.insecure_channel(addr, [("grpc.max_receive_message_length", 64 << 20)])
    stub = ps_pb2_grpc.ParameterServerStub(ch)
    hog = [("authorization", "Bearer " + hog_tok)]
    good = [("authorization", "Bearer " + good_tok)]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 1, 28, 28)).astype(np.float32)
    inp = ps_pb2.Tensor(shape=list(x.shape), data=x.tobytes(), dtype=ps_pb2.FLOAT32)
    rss0 = rss_mb(pid)
    fails = []

    held, refused, worst = 0, None, 0
    t_end = time.monotonic() + 60
    for i in range(400):
        if time.monotonic() > t_end:
            break
        try:
            stub.Forward(ps_pb2.ForwardRequest(context_id=10_000 + i, input=inp, train=True, trainer_rank=7),
                         metadata=hog, timeout=30)
            held += 1
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                fails.append(f"hog forward {i}: {e.code().name}: {e.details()}")
                break
            refused = e.details()
        st = stub.Status(ps_pb2.StatusRequest(), metadata=hog, timeout=10)
        worst = max(worst, st.context_bytes)
        if refused:
            break
    if not refused:
        fails.append(f"the hog opened {held} contexts of batch 64 and was never refused")
    elif "max_context_bytes" not in refused:
        fails.append(f"refusal does not name server.max_context_bytes: {refused}")
    if worst > max_bytes:
        fails.append(f"Status.context_bytes reached {worst} > max_context_bytes {max_bytes}")
    st0 = stub.Status(ps_pb2.StatusRequest(), metadata=good, timeout=10)

    # The good client trains although the hog holds the budget.
    ok = 0
    for b in range(5):
        cid = 90_000 + b
        try:
            r = stub.Forward(ps_pb2.ForwardRequest(context_id=cid, input=inp, train=True, trainer_rank=1),
                             metadata=good, timeout=30)
            g = np.full(np.prod(list(r.output.shape)), 1.0 / 64, np.float32)
            stub.Backward(ps_pb2.BackwardRequest(
                context_id=cid, step=True,
                grad_output=ps_pb2.Tensor(shape=list(r.output.shape), data=g.tobytes(), dtype=ps_pb2.FLOAT32)),
                metadata=good, timeout=30)
            ok += 1
        except grpc.RpcError as e:
            fails.append(f"good client batch {b}: {e.code().name}: {e.details()}")
            break
    st1 = stub.Status(ps_pb2.StatusRequest(), metadata=good, timeout=10)
    if ok == 5 and st1.contexts_evicted <= st0.contexts_evicted:
        fails.append("the good client trained but no hog context was evicted (was the budget full?)")
    growth = rss_mb(pid) - rss0
    print(f"context budget: hog held {held} contexts of batch 64 ({worst / 2**20:.1f} MiB at most, "
          f"budget {max_bytes / 2**20:.0f} MiB) before RESOURCE_EXHAUSTED; good client trained {ok}/5 batches; "
          f"{st1.contexts_evicted} hog contexts evicted; psd rss growth {growth:.0f} MiB")
    if refused:
        print(f"  refusal: {refused}")
    if growth > max_bytes / 2**20 + 300:
        fails.append(f"RSS grew {growth:.0f} MiB")
    if fails:
        print("FAIL: " + "; ".join(fails))
        sys.exit(1)


if __name__ == "__main__":
    main()
