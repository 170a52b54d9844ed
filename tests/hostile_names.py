#!/usr/bin/python3
"""hostile_names.py - names a careless or hostile client controls, against a
psd (mnist_cnn, tokens "A..." and "B..." whose names share their first 57
characters, and a reader "monitor"; server.stop_metric reward), for
tests/it_hostile_names.sh. Python grpcio with stubs generated from
proto/ps.proto at test time (PYTHONPATH).

  hostile_names.py ADDR TOKEN_A TOKEN_B READER_TOKEN

1. token names sharing 57 characters are two clients: B's Backward,
   GetGradients and Step on A's context are PERMISSION_DENIED, A's Step is
   applied once;
2. round-metric names: B's Steps with 8 junk scalar names are refused past
   its share (4 names), so the stop metric's slot stays; A's reward counts;
3. the reader token may call the health check (SERVING);
4. one parameter twice in a PushGradients is refused (checked by
   generic_client.py on rnn_lm; here the method is only reachable by a
   trainer token: a reader gets PERMISSION_DENIED).
Prints one line; exits 1 naming what broke.
"""
import sys

import grpc
import numpy as np

import ps_pb2
import ps_pb2_grpc

HEALTH = "/grpc.health.v1.Health/Check"


def main():
    addr, ta, tb, tr = sys.argv[1:5]
    ch = grpc.insecure_channel(addr, [("grpc.max_receive_message_length", 64 << 20)])
    grpc.channel_ready_future(ch).result(timeout=30)
    stub = ps_pb2_grpc.ParameterServerStub(ch)
    A = [("authorization", "Bearer " + ta)]
    B = [("authorization", "Bearer " + tb)]
    R = [("authorization", "Bearer " + tr)]
    fails = []

    def expect(code, fn, what):
        try:
            fn()
            fails.append(f"{what}: accepted, expected {code.name}")
        except grpc.RpcError as e:
            if e.code() != code:
                fails.append(f"{what}: {e.code().name}: {e.details()} (expected {code.name})")
            return e.details()
        return ""

    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 1, 28, 28)).astype(np.float32)
    inp = ps_pb2.Tensor(shape=list(x.shape), data=x.tobytes(), dtype=ps_pb2.FLOAT32)

    def batch(ctx, md):
        f = stub.Forward(ps_pb2.ForwardRequest(context_id=ctx, input=inp, train=True, trainer_rank=1), metadata=md,
                         timeout=30)
        g = np.zeros(tuple(f.output.shape), np.float32)
        g[:, 3] = -0.25
        grad = ps_pb2.Tensor(shape=list(g.shape), data=g.tobytes(), dtype=ps_pb2.FLOAT32)
        stub.Backward(ps_pb2.BackwardRequest(context_id=ctx, grad_output=grad), metadata=md, timeout=30)
        return grad

    # 1. two identities whose names share 57 characters
    v0 = stub.Status(ps_pb2.StatusRequest(), metadata=A, timeout=10).model_version
    ctx = 0xA11CE00000000001
    grad = batch(ctx, A)
    expect(grpc.StatusCode.PERMISSION_DENIED,
           lambda: stub.GetGradients(ps_pb2.GetGradientsRequest(context_id=ctx), metadata=B, timeout=10),
           "B's GetGradients of A's context")
    expect(grpc.StatusCode.PERMISSION_DENIED,
           lambda: stub.Backward(ps_pb2.BackwardRequest(context_id=ctx, grad_output=grad), metadata=B, timeout=10),
           "B's Backward on A's context")
    expect(grpc.StatusCode.PERMISSION_DENIED,
           lambda: stub.Step(ps_pb2.StepRequest(context_id=ctx), metadata=B, timeout=10), "B's Step of A's context")
    s = stub.Step(ps_pb2.StepRequest(context_id=ctx), metadata=A, timeout=10)
    if s.model_version != v0 + 1:
        fails.append(f"A's step: version {s.model_version}, expected {v0 + 1}")

    # 2. junk scalar names cannot push the stop metric out
    refused = 0
    for k in range(8):
        c = 0xB0B0000000000001 + k
        batch(c, B)
        sc = [ps_pb2.ScalarValue(name=f"junk{k}", value=1.0)]
        try:
            stub.Step(ps_pb2.StepRequest(context_id=c, scalars=sc), metadata=B, timeout=10)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.INVALID_ARGUMENT or "per client" not in e.details():
                fails.append(f"junk name {k}: {e.code().name}: {e.details()}")
            refused += 1
    if refused != 4:
        fails.append(f"{refused} of 8 junk names refused, expected 4 (each client brings at most 4)")
    c = 0xA11CE00000000002
    batch(c, A)
    s = stub.Step(ps_pb2.StepRequest(context_id=c, scalars=[ps_pb2.ScalarValue(name="reward", value=42.0)]),
                  metadata=A, timeout=10)
    rw = [r for r in s.round_scalars if r.name == "reward"]
    if not rw or rw[0].max != 42.0:
        fails.append(f"A's reward not in its round's metrics: {list(s.round_scalars)}")

    # 3. the reader token and the health check
    try:
        h = ch.unary_unary(HEALTH, request_serializer=lambda b: b, response_deserializer=lambda b: b)(
            b"", metadata=R, timeout=10)
        if h != b"\x08\x01":  # HealthCheckResponse{status: SERVING}
            fails.append(f"reader's health check answered {h!r}")
    except grpc.RpcError as e:
        fails.append(f"reader's health check: {e.code().name}: {e.details()}")
    # 4. ... but not a training call
    expect(grpc.StatusCode.PERMISSION_DENIED,
           lambda: stub.PushGradients(ps_pb2.PushGradientsRequest(context_id=7), metadata=R, timeout=10),
           "reader's PushGradients")

    print(f"names: two 63-character token names sharing 57 characters kept apart (3 calls refused); {refused} of 8 "
          "junk scalar names refused past the client's share, the reward still counted; a reader's health check "
          "answered")
    if fails:
        print("FAIL: " + "; ".join(fails))
        sys.exit(1)


if __name__ == "__main__":
    main()
