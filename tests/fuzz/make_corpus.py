#!/usr/bin/python3
"""Writes the seed corpus of fuzz_service into tests/fuzz/corpus/ (committed).

Each seed is a sequence of records (see fuzz_service.c): selector byte,
2-byte little-endian length, protobuf payload. Handler order is that of
ps_service_methods(): 0 Forward, 1 Backward, 2 GetGradients, 3 Step,
4 ListParameters, 5 GetParameters, 6 Status, 7 = tokens-file parser.
"""
import os
import struct


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field(num, wire, payload):
    key = varint((num << 3) | wire)
    if wire == 0:
        return key + varint(payload)
    return key + varint(len(payload)) + payload


def tensor(shape, values):
    shp = b"".join(varint(d) for d in shape)
    data = struct.pack("<%df" % len(values), *values)
    return field(2, 2, shp) + field(3, 2, data)


def rec(sel, payload):
    return bytes([sel]) + struct.pack("<H", len(payload)) + payload


def forward(ctx, n, train=True, fill=0.1):
    msg = field(1, 0, ctx) + field(2, 2, tensor([n, 1, 28, 28], [fill] * (n * 784)))
    if train:
        msg += field(3, 0, 1) + field(4, 0, 1)
    return msg


def backward(ctx, n, step=False, val=-0.25):
    msg = field(1, 0, ctx) + field(2, 2, tensor([n, 10], [val] * (n * 10)))
    if step:
        msg += field(3, 0, 1)
    return msg


seeds = {
    "cycle": rec(0, forward(1, 1)) + rec(1, backward(1, 1)) + rec(2, field(1, 0, 1)) +
             rec(3, field(1, 0, 1)) + rec(3, field(1, 0, 1)),
    "fused": rec(0, forward(2, 2)) + rec(1, backward(2, 2, step=True)),
    "eval": rec(0, forward(0, 1, train=False)),
    "nan_skip": rec(0x20, forward(3, 1, fill=float("nan"))) + rec(1, backward(3, 1)) + rec(3, field(1, 0, 3)),
    "inf_grad": rec(0, forward(4, 1)) + rec(1, backward(4, 1, val=float("inf"))) + rec(3, field(1, 0, 4)),
    "huge_grad": rec(0, forward(5, 1)) + rec(1, backward(5, 1, val=3e38)) + rec(3, field(1, 0, 5)),
    "list_status": rec(4, b"") + rec(6, b""),
    "params": rec(5, b""),
    "bomb": rec(0, field(2, 2, field(2, 2, varint(10**12) + varint(1) + varint(28) + varint(28)) +
                       field(3, 2, b"\0" * 16))),
    "mismatch": rec(0, field(1, 0, 9) + field(2, 2, tensor([2, 1, 28, 28], [0.0] * 784)) + field(3, 0, 1)),
    "truncated": rec(0, forward(6, 1)[:50]),
    "slices": rec(0x18, forward(7, 1)) + rec(0x09, backward(7, 1)) + rec(0x13, field(1, 0, 7)),
    "unknown_ctx": rec(1, backward(99, 1)) + rec(3, field(1, 0, 99)) + rec(2, field(1, 0, 99)),
    "tokens": rec(7, b"# name role token\ntrainer1 trainer 0123456789abcdef0123\nmon reader fedcba9876543210fedc\n"),
}

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
os.makedirs(out, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
print("make_corpus: wrote %d seeds to %s" % (len(seeds), out))
