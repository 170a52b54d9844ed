#!/usr/bin/python3
"""settle_client.py - settling steps across a psd restart, for
tests/it_sync_once.sh. Python grpcio with stubs generated from
proto/ps.proto at test time (PYTHONPATH); psd runs mnist_cnn.

  settle_client.py step ADDR FILE N     N batches (Forward, Backward, Step) under fresh
                                        context ids; writes "ctx version" lines to FILE
  settle_client.py settle ADDR FILE V   after a restart from a checkpoint of version V:
                                        Step again every context of FILE. Those whose
                                        version is <= V (the checkpoint holds their step)
                                        must be answered OK with that version (not
                                        NOT_FOUND, which the retry rules read as "run the
                                        batch again": a second application); the others
                                        must be NOT_FOUND (not held: run again).
Prints one line and exits 1 when a rule is broken.
"""
import os
import sys

import grpc
import numpy as np

import ps_pb2
import ps_pb2_grpc


def main():
    mode, addr, path, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    ch = grpc.insecure_channel(addr, [("grpc.max_receive_message_length", 64 << 20)])
    grpc.channel_ready_future(ch).result(timeout=30)
    stub = ps_pb2_grpc.ParameterServerStub(ch)
    if mode == "step":
        rng = np.random.default_rng(3)
        base = int.from_bytes(os.urandom(4), "little") << 32
        lines = []
        for b in range(n):
            ctx = base | (b + 1)
            x = rng.standard_normal((4, 1, 28, 28)).astype(np.float32)
            f = stub.Forward(ps_pb2.ForwardRequest(context_id=ctx, train=True, trainer_rank=1, input=ps_pb2.Tensor(
                shape=list(x.shape), data=x.tobytes(), dtype=ps_pb2.FLOAT32)), timeout=30)
            g = np.zeros(tuple(f.output.shape), np.float32)  # NLL of log-probabilities, label b % 10
            g[:, b % 10] = -1.0 / g.shape[0]
            stub.Backward(ps_pb2.BackwardRequest(context_id=ctx, grad_output=ps_pb2.Tensor(
                shape=list(f.output.shape), data=g.tobytes(), dtype=ps_pb2.FLOAT32)), timeout=30)
            s = stub.Step(ps_pb2.StepRequest(context_id=ctx), timeout=30)
            lines.append(f"{ctx} {s.model_version}\n")
        with open(path, "w") as fh:
            fh.writelines(lines)
        print(f"settle_client: {n} steps acknowledged")
        return
    held = n  # the restored checkpoint's version
    ok = lost = 0
    fails = []
    for line in open(path):
        ctx, v = (int(w) for w in line.split())
        try:
            s = stub.Step(ps_pb2.StepRequest(context_id=ctx), timeout=30)
            if v > held:
                fails.append(f"context {ctx:x} (version {v} > checkpoint {held}) answered OK: it is not in these weights")
            elif s.model_version != v:
                fails.append(f"context {ctx:x}: version {s.model_version}, acknowledged {v}")
            else:
                ok += 1
        except grpc.RpcError as e:
            if v <= held:
                fails.append(f"context {ctx:x} (version {v} <= checkpoint {held}): {e.code().name}: {e.details()}"
                             " - the retry rules would run the batch again")
            elif e.code() != grpc.StatusCode.NOT_FOUND:
                fails.append(f"context {ctx:x} (after the checkpoint): {e.code().name}, expected NOT_FOUND")
            else:
                lost += 1
    print(f"settle after restart: {ok} steps the checkpoint (version {held}) holds answered with their version, "
          f"{lost} later ones NOT_FOUND")
    if ok == 0:
        fails.append("no step was held by the checkpoint: the case was not tested")
    if fails:
        print("FAIL: " + "; ".join(fails[:5]))
        sys.exit(1)


if __name__ == "__main__":
    main()
