#!/usr/bin/python3
"""psd_probe.py - what an operator's or a PyTorch user's tools see of psd,
used by tests/it_service.sh. Independent of psd's C code: gRPC through
Python's grpcio with protobuf encoded by hand, safetensors parsed with
json/struct, Prometheus text parsed by prometheus_client's own parser.

  psd_probe.py health ADDR [SERVICE]      print SERVING / NOT_SERVING (exit 1 on an RPC error)
  psd_probe.py metrics URL NAME           parse the page, print the value of sample NAME
  psd_probe.py ckpt FILE ADDR             checkpoint names/shapes == ListParameters; loads into
                                          PyTorch's tutorial Net when torch is installed
  psd_probe.py notify SOCKET ADDR OUT     receive sd_notify datagrams; on READY=1 check ADDR
                                          accepts TCP connections; append what happened to OUT
"""
import json
import socket
import struct
import sys


def varint(b, i):
    x = shift = 0
    while True:
        c = b[i]
        i += 1
        x |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return x, i


def fields(b):
    """Yield (field number, wire type, value) of a protobuf message."""
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(b, i)
        elif wt == 2:
            n, i = varint(b, i)
            v, i = b[i:i + n], i + n
        elif wt == 1:
            v, i = b[i:i + 8], i + 8
        elif wt == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % wt)
        yield num, wt, v


def unary(addr, method, request=b""):
    import grpc
    with grpc.insecure_channel(addr) as ch:
        call = ch.unary_unary(method, request_serializer=lambda x: x, response_deserializer=lambda x: x)
        return call(request, timeout=10)


def health(addr, service=""):
    import grpc
    req = b"" if not service else b"\x0a" + bytes([len(service)]) + service.encode()
    try:
        resp = unary(addr, "/grpc.health.v1.Health/Check", req)
    except grpc.RpcError as e:
        print("%s: %s" % (e.code().name, e.details()))
        return 1
    status = 0
    for num, _, v in fields(resp):
        if num == 1:
            status = v
    print({0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}.get(status, str(status)))
    return 0


def metrics(url, name):
    import urllib.request
    from prometheus_client.parser import text_string_to_metric_families
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    value = None
    for fam in text_string_to_metric_families(text):  # raises on malformed text
        for s in fam.samples:
            if s.name == name and value is None:
                value = s.value
    if value is None:
        print("no sample %s" % name)
        return 1
    print(int(value) if value == int(value) else value)
    return 0


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    body = data[8 + n:]
    end = max(v["data_offsets"][1] for v in header.values())
    assert end == len(body), "data size %d != %d" % (len(body), end)
    return header, meta, body


def list_parameters(addr):
    params = []
    for num, _, v in fields(unary(addr, "/ps.ParameterServer/ListParameters")):
        if num != 1:
            continue
        name, shape = None, []
        for n2, wt, v2 in fields(v):
            if n2 == 1:
                name = v2.decode()
            elif n2 == 2 and wt == 2:  # packed
                i = 0
                while i < len(v2):
                    d, i = varint(v2, i)
                    shape.append(d)
            elif n2 == 2:
                shape.append(v2)
        params.append((name, shape))
    return params


def ckpt(path, addr):
    header, meta, body = read_safetensors(path)
    want = list_parameters(addr)
    got = {k: v["shape"] for k, v in header.items()}
    if got != dict(want) or any(v["dtype"] != "F32" for v in header.values()):
        print("checkpoint %s != ListParameters %s" % (got, want))
        return 1
    print("names and shapes match ListParameters: %d tensors, model_version %s" %
          (len(want), meta.get("psd.model_version")))
    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except ImportError:
        print("torch not installed: skipped loading into PyTorch")
        return 0

    class Net(nn.Module):  # the PyTorch tutorial's network
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 32, 3, 1)
            self.conv2 = nn.Conv2d(32, 64, 3, 1)
            self.dropout1 = nn.Dropout2d(0.25)
            self.dropout2 = nn.Dropout2d(0.5)
            self.fc1 = nn.Linear(9216, 128)
            self.fc2 = nn.Linear(128, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
            x = torch.flatten(x, 1)
            return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)

    import numpy as np
    sd = {}
    for k, v in header.items():
        a, b = v["data_offsets"]
        sd[k] = torch.from_numpy(np.frombuffer(body[a:b], dtype="<f4").copy().reshape(v["shape"]))
    net = Net()
    net.load_state_dict(sd, strict=True)  # raises on any missing, extra or mis-shaped tensor
    out = net(torch.zeros(2, 1, 28, 28))
    print("loaded into PyTorch %s with load_state_dict(strict=True); output %s" %
          (torch.__version__, tuple(out.shape)))
    return 0


def notify(sock_path, addr, out):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(sock_path)
    host, port = addr.rsplit(":", 1)
    with open(out, "a") as log:
        while True:
            msg = s.recv(4096).decode()
            for line in msg.split("\n"):
                note = line
                if line == "READY=1":
                    try:
                        socket.create_connection((host, int(port)), timeout=2).close()
                        note += " (port accepts connections)"
                    except OSError as e:
                        note += " (port NOT accepting: %s)" % e
                log.write(note + "\n")
                log.flush()
            if "STOPPING=1" in msg:
                return 0


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    sys.exit({"health": health, "metrics": metrics, "ckpt": ckpt, "notify": notify}[cmd](*args))
