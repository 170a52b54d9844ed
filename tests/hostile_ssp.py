#!/usr/bin/python3
"""hostile_ssp.py - Forwards held back by consistency "ssp" whose clients go
away, for tests/it_hostile.sh. Python grpcio with stubs generated from
proto/ps.proto at test time (PYTHONPATH); psd must run mnist_cnn with
server.consistency=ssp and server.max_staleness=0.

  hostile_ssp.py ADDR PSD_PID ROUNDS

1. ranks 1 and 2 join; rank 1 steps once, so its next training Forwards are
   held back until rank 2 steps;
2. the attacker sends ROUNDS x 8 concurrent Forwards of rank 1 (batch 512,
   1.6 MB of input each) with a 0.2 s deadline: each is held, then given up
   by its client. A held Forward whose client went away must be taken back
   at once (psd used to keep each one's request until rank 1's turn came):
   psd's RSS grows by far less than what the attacker sent (asserted: under
   a third of it, and under 160 MiB);
3. none of them runs when rank 2 steps (Status.live_contexts does not grow
   by the attacker's contexts), and rank 1's next Forward runs at once;
4. with MAX_CONTEXT_BYTES given (psd's server.max_context_bytes), rank 1 is
   ahead again and sends 24 concurrent batch-512 Forwards it does not give
   up: held Forwards get a byte share of a quarter of it, so those past the
   share are refused RESOURCE_EXHAUSTED naming the key while the rest wait
   (psd used to hold them all: bounded only by the call share).
Prints one line: Forwards held and given up, bytes sent, RSS growth.

  hostile_ssp.py ADDR PSD_PID ROUNDS [MAX_CONTEXT_BYTES]
"""
import sys
import time
from concurrent import futures

import grpc
import numpy as np

import ps_pb2
import ps_pb2_grpc
from hostile import rss_mb  # tests/hostile.py


def main():
    addr, pid, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    budget = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    ch = grpc.insecure_channel(addr, [("grpc.max_send_message_length", 64 << 20)])
    stub = ps_pb2_grpc.ParameterServerStub(ch)
    rng = np.random.default_rng(3)

    def fwd(ctx, rank, n, timeout):
        x = rng.standard_normal((n, 1, 28, 28)).astype(np.float32)
        y = rng.integers(0, 10, n).astype(np.int64)
        req = ps_pb2.ForwardRequest(context_id=ctx, train=True, trainer_rank=rank,
                                    input=ps_pb2.Tensor(shape=list(x.shape), data=x.tobytes(), dtype=ps_pb2.FLOAT32),
                                    targets=ps_pb2.Tensor(shape=[n], data=y.tobytes(), dtype=ps_pb2.INT64))
        return stub.Forward(req, timeout=timeout)

    # 1. both ranks join; rank 1 steps once and is then ahead
    fwd(1, 1, 4, 30)
    fwd(2, 2, 4, 30)
    stub.Step(ps_pb2.StepRequest(context_id=1), timeout=30)
    st0 = stub.Status(ps_pb2.StatusRequest(), timeout=30)
    rss0 = rss_mb(pid)

    # 2. held Forwards given up by their client
    n, sent, given_up, other = 512, 0, 0, []
    x = rng.standard_normal((n, 1, 28, 28)).astype(np.float32)
    y = np.zeros(n, np.int64)
    big = lambda ctx: ps_pb2.ForwardRequest(
        context_id=ctx, train=True, trainer_rank=1,
        input=ps_pb2.Tensor(shape=list(x.shape), data=x.tobytes(), dtype=ps_pb2.FLOAT32),
        targets=ps_pb2.Tensor(shape=[n], data=y.tobytes(), dtype=ps_pb2.INT64))
    peak = rss0
    with futures.ThreadPoolExecutor(8) as pool:
        for r in range(rounds):
            calls = [pool.submit(stub.Forward, big(1000 + 8 * r + i), timeout=0.2) for i in range(8)]
            for c in calls:
                try:
                    c.result()
                    other.append("a held-back Forward was answered OK while rank 2 had not stepped")
                except grpc.RpcError as e:
                    if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                        given_up += 1
                    else:
                        other.append(f"{e.code().name}: {e.details()}")
            sent += 8 * x.nbytes
            peak = max(peak, rss_mb(pid) or 0)
    time.sleep(0.5)
    peak = max(peak, rss_mb(pid) or 0)
    st1 = stub.Status(ps_pb2.StatusRequest(), timeout=30)
    held = st1.ssp_deferred - st0.ssp_deferred

    # 3. rank 2 steps: nothing of the attacker's runs; rank 1 runs at once
    stub.Step(ps_pb2.StepRequest(context_id=2), timeout=30)
    time.sleep(0.5)
    st2 = stub.Status(ps_pb2.StatusRequest(), timeout=30)
    t = time.monotonic()
    fwd(3, 1, 4, 30)
    lat = time.monotonic() - t
    grown = peak - rss0

    # 4. rank 1 ahead again; 24 held Forwards it waits for: a byte share
    share_note, share_fail = "", []
    if budget:
        stub.Step(ps_pb2.StepRequest(context_id=3), timeout=30)
        codes = {}
        detail = ""
        with futures.ThreadPoolExecutor(24) as pool:
            calls = [pool.submit(stub.Forward, big(5000 + i), timeout=3) for i in range(24)]
            for c in calls:
                try:
                    c.result()
                    codes["OK"] = codes.get("OK", 0) + 1
                except grpc.RpcError as e:
                    codes[e.code().name] = codes.get(e.code().name, 0) + 1
                    if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                        detail = e.details()
        refused = codes.get("RESOURCE_EXHAUSTED", 0)
        waited = codes.get("DEADLINE_EXCEEDED", 0)
        fits = budget // 4 // (x.nbytes + y.nbytes)
        share_note = (f"; 24 held Forwards of {(x.nbytes + y.nbytes) / 1e6:.1f} MB with a held share of "
                      f"{budget / 4 / 2**20:.0f} MiB: {codes}")
        if refused == 0 or "server.max_context_bytes" not in detail:
            share_fail.append(f"no held Forward was refused for its byte share ({codes}; {detail!r})")
        if waited > fits + 1:
            share_fail.append(f"{waited} Forwards held, more than the {fits} the share fits")
        if waited == 0:
            share_fail.append("none was held: the case did not test the hold")
    print(f"{held} Forwards held and given up by their client ({sent / 1e6:.0f} MB sent): RSS +{grown:.0f} MiB "
          f"(peak); open contexts {st1.live_contexts} -> {st2.live_contexts} after the slow rank stepped; "
          f"rank 1's next Forward in {lat:.2f} s{share_note}")
    fails = other[:3] + share_fail
    if held < 8 * rounds // 2:
        fails.append(f"only {held} of {8 * rounds} Forwards were held: the attack did not test the hold")
    if grown > min(160, sent / 3 / 2**20):
        fails.append(f"RSS grew {grown:.0f} MiB for {sent / 2**20:.0f} MiB of held Forwards given up")
    if st2.live_contexts > st1.live_contexts + 1:
        fails.append(f"{st2.live_contexts - st1.live_contexts} contexts opened when the slow rank stepped: "
                     "held Forwards given up by their client ran")
    if fails:
        print("FAIL: " + "; ".join(fails))
        sys.exit(1)


if __name__ == "__main__":
    main()
