#!/usr/bin/python3
"""PyTorch anchors for `make bench` (run with Debian's python3-torch).

  torch_ref.py local    DATA  a plain local training loop of the same network
  torch_ref.py tutorial DATA  PyTorch's RPC parameter-server tutorial
                              (https://pytorch.org/tutorials/intermediate/rpc_param_server_tutorial.html),
                              re-implemented faithfully: a ParameterServer
                              holding the Net behind an RRef, a TrainerNet
                              whose forward is rpc_sync to the server,
                              dist_autograd contexts, the per-step
                              get_dist_gradients check and a
                              DistributedOptimizer(SGD, lr=0.03); PS + one
                              trainer (the tutorial crashes with two)

Both read the same IDX files as psd's bench (normalised like
ps_mnist_load), batch 32, and print, after WARMUP batches, REPS timed runs
of BATCHES batches each as machine-readable lines:

  torch what=local threads=2 reps=3 median=... min=... max=... unit=samples/s

Environment: BATCHES (100), WARMUP (10), REPS (3), TORCH_THREADS (torch's
default when unset); ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA cap the ISA
of ATen's kernels and of its oneDNN convolutions (the line says both).
"""
import gzip
import os
import statistics
import struct
import sys
import threading
import time

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.distributed.optim import DistributedOptimizer

# the tutorial's network (same layers as psd's mnist_cnn), as the tutorial writes it
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "models"))
from rpc_tutorials import Net  # noqa: E402

BATCH = 32
BATCHES = int(os.environ.get("BATCHES", "100"))
WARMUP = int(os.environ.get("WARMUP", "10"))
REPS = int(os.environ.get("REPS", "3"))


def set_threads():
    n = os.environ.get("TORCH_THREADS")
    if n:
        torch.set_num_threads(int(n))


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08:
        raise SystemExit(f"{path}: not an unsigned-byte IDX file")
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    data = torch.frombuffer(bytearray(raw[4 + 4 * ndim:]), dtype=torch.uint8)
    return data.reshape(dims)


def load(data_dir):
    x = read_idx(os.path.join(data_dir, "train-images-idx3-ubyte")).float()
    y = read_idx(os.path.join(data_dir, "train-labels-idx1-ubyte")).long()
    x = ((x / 255.0) - 0.1307) / 0.3081  # as ps_mnist_load
    return x.unsqueeze(1).contiguous(), y


def batches(x, y):
    n = x.shape[0] // BATCH
    i = 0
    while True:
        b = i % n
        yield x[b * BATCH:(b + 1) * BATCH], y[b * BATCH:(b + 1) * BATCH]
        i += 1


def cpu_capability():
    """ATen's kernel ISA as torch reports it ("AVX2", "AVX512", "NO AVX"), no spaces."""
    for line in torch.__config__.show().splitlines():
        if "CPU capability usage:" in line:
            return line.split(":", 1)[1].strip().replace(" ", "_")
    return "unknown"


def report(what, rates):
    # aten: ATen's own kernels (capped by ATEN_CPU_CAPABILITY); onednn_max:
    # the cap on the oneDNN (MKL-DNN) convolutions torch runs.
    print(f"torch what={what} threads={torch.get_num_threads()} aten={cpu_capability()} "
          f"onednn_max={os.environ.get('ONEDNN_MAX_CPU_ISA') or 'none'} batch={BATCH} reps={len(rates)} "
          f"median={statistics.median(rates):.1f} min={min(rates):.1f} max={max(rates):.1f} unit=samples/s",
          flush=True)


def timed(step, it):
    for _ in range(WARMUP):
        step(*next(it))
    rates = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        for _ in range(BATCHES):
            step(*next(it))
        rates.append(BATCHES * BATCH / (time.perf_counter() - t0))
    return rates


def run_local(data_dir):
    set_threads()
    x, y = load(data_dir)
    torch.manual_seed(0)
    model = Net()
    opt = optim.SGD(model.parameters(), lr=0.03)

    def step(data, target):
        opt.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        opt.step()

    report("local", timed(step, batches(x, y)))


# ---- the tutorial's parameter server, as written there ----
def call_method(method, rref, *args, **kwargs):
    return method(rref.local_value(), *args, **kwargs)


def remote_method(method, rref, *args, **kwargs):
    args = [method, rref] + list(args)
    return rpc.rpc_sync(rref.owner(), call_method, args=args, kwargs=kwargs)


class ParameterServer(nn.Module):
    def __init__(self, num_gpus=0):
        super().__init__()
        self.model = Net(num_gpus=num_gpus)
        self.input_device = torch.device("cpu")

    def forward(self, inp):
        inp = inp.to(self.input_device)
        out = self.model(inp)
        return out.to("cpu")

    def get_dist_gradients(self, cid):
        grads = dist_autograd.get_gradients(cid)
        cpu_grads = {}
        for k, v in grads.items():
            k_cpu, v_cpu = k.to("cpu"), v.to("cpu")
            cpu_grads[k_cpu] = v_cpu
        return cpu_grads

    def get_param_rrefs(self):
        return [rpc.RRef(param) for param in self.model.parameters()]


param_server = None
global_lock = threading.Lock()


def get_parameter_server(num_gpus=0):
    global param_server
    with global_lock:
        if not param_server:
            param_server = ParameterServer(num_gpus=num_gpus)
        return param_server


class TrainerNet(nn.Module):
    def __init__(self, num_gpus=0):
        super().__init__()
        self.param_server_rref = rpc.remote("parameter_server", get_parameter_server, args=(num_gpus,))

    def get_global_param_rrefs(self):
        return remote_method(ParameterServer.get_param_rrefs, self.param_server_rref)

    def forward(self, x):
        return remote_method(ParameterServer.forward, self.param_server_rref, x)


def run_worker(rank, world_size, data_dir, port):
    set_threads()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, rpc_timeout=120)
    if rank == 0:
        rpc.init_rpc(name="parameter_server", rank=rank, world_size=world_size, rpc_backend_options=opts)
    else:
        rpc.init_rpc(name=f"trainer_{rank}", rank=rank, world_size=world_size, rpc_backend_options=opts)
        x, y = load(data_dir)
        net = TrainerNet()
        param_rrefs = net.get_global_param_rrefs()
        opt = DistributedOptimizer(optim.SGD, param_rrefs, lr=0.03)

        def step(data, target):
            with dist_autograd.context() as cid:
                model_output = net(data)
                loss = F.nll_loss(model_output, target)
                dist_autograd.backward(cid, [loss])
                assert remote_method(ParameterServer.get_dist_gradients, net.param_server_rref, cid) != {}
                opt.step(cid)

        report("tutorial", timed(step, batches(x, y)))
    rpc.shutdown()


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("local", "tutorial"):
        raise SystemExit(__doc__)
    what, data_dir = sys.argv[1], sys.argv[2]
    if what == "local":
        run_local(data_dir)
    else:
        port = 29500 + os.getpid() % 1000
        mp.spawn(run_worker, args=(2, data_dir, port), nprocs=2, join=True)


if __name__ == "__main__":
    main()
