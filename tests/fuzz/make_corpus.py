#!/usr/bin/python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/
(committed): service (fuzz_service.c), config (fuzz_config.c: the shipped
configs plus broken ones), safetensors (fuzz_safetensors.c: small files
written here by hand, as the format's reference describes them), and the data
loaders of ps-train fit: idx (fuzz_idx.c), npy (fuzz_npy.c), npz
(fuzz_npz.c), small files written here with struct, gzip and zipfile as the
formats' descriptions (trainer/idx.h, trainer/npy.h) say. The first byte of an
idx or npy seed is the target's mode: 0 the rest as is, 1 the rest gzip'ed by
the target.

fuzz_service's seeds:

Each seed is a sequence of records (see fuzz_service.c): selector byte,
2-byte little-endian length, protobuf payload. The selector's low 4 bits are
a method id - the row's place in PS_METHODS, common/methods.h, read from
there - or the number of rows for the tokens-file parser; bits 4-5 the
slices, bit 6 the nonfinite policy "skip".
"""
import gzip
import io
import json
import os
import re
import struct
import zipfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "..", "..", "common", "methods.h")) as f:
    ROWS = re.findall(r"^\s*X\((\w+),", f.read(), re.M)
M = {name: i for i, name in enumerate(ROWS)}
TOKENS = len(ROWS)
SLICES = lambda n: (n - 1) << 4  # noqa: E731
SKIP = 0x40


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


FW, BW, GG, ST = M["FORWARD"], M["BACKWARD"], M["GET_GRADIENTS"], M["STEP"]


def named(num, name):
    return field(num, 2, name.encode())


def push(ctx, name, shape, values):
    """PushGradientsRequest: context, rank 1, one named gradient."""
    return field(1, 0, ctx) + field(2, 2, named(1, name) + tensor(shape, values)) + field(3, 0, 1)


seeds = {
    "cycle": rec(FW, forward(1, 1)) + rec(BW, backward(1, 1)) + rec(GG, field(1, 0, 1)) +
             rec(ST, field(1, 0, 1)) + rec(ST, field(1, 0, 1)),
    "fused": rec(FW, forward(2, 2)) + rec(BW, backward(2, 2, step=True)),
    "eval": rec(FW, forward(0, 1, train=False)),
    "nan_skip": rec(FW | SKIP, forward(3, 1, fill=float("nan"))) + rec(BW, backward(3, 1)) +
                rec(ST, field(1, 0, 3)),
    "inf_grad": rec(FW, forward(4, 1)) + rec(BW, backward(4, 1, val=float("inf"))) + rec(ST, field(1, 0, 4)),
    "huge_grad": rec(FW, forward(5, 1)) + rec(BW, backward(5, 1, val=3e38)) + rec(ST, field(1, 0, 5)),
    "list_status": rec(M["LIST_PARAMETERS"], b"") + rec(M["STATUS"], b""),
    "params": rec(M["GET_PARAMETERS"], b""),
    "params_paged": rec(M["GET_PARAMETERS"], field(13, 0, 4096)) +
                    rec(M["GET_PARAMETERS"], named(10, "fc") + field(11, 0, 1) + field(12, 0, 3)),
    "grads_paged": rec(FW, forward(10, 1)) + rec(BW, backward(10, 1)) + rec(GG, field(1, 0, 10) + field(13, 0, 4096)) +
                   rec(GG, field(1, 0, 10) + field(11, 0, 2) + field(12, 0, 16) + field(13, 0, 20000)) +
                   rec(GG, field(1, 0, 10) + field(11, 0, 9)) + rec(GG, field(1, 0, 10) + field(12, 0, 2**63 - 1)),
    "bomb": rec(FW, field(2, 2, field(2, 2, varint(10**12) + varint(1) + varint(28) + varint(28)) +
                        field(3, 2, b"\0" * 16))),
    "mismatch": rec(FW, field(1, 0, 9) + field(2, 2, tensor([2, 1, 28, 28], [0.0] * 784)) + field(3, 0, 1)),
    "truncated": rec(FW, forward(6, 1)[:50]),
    "slices": rec(FW | SLICES(2), forward(7, 1)) + rec(BW | SLICES(1), backward(7, 1)) +
              rec(ST | SLICES(2), field(1, 0, 7)),
    "unknown_ctx": rec(BW, backward(99, 1)) + rec(ST, field(1, 0, 99)) + rec(GG, field(1, 0, 99)),
    "push": rec(M["PUSH_GRADIENTS"], push(8, "fc2.bias", [10], [0.5] * 10)) +
            rec(M["PUSH_GRADIENTS"], push(0, "nope", [1], [1.0])),
    "partial": rec(M["REPORT_PARTIAL"], field(1, 0, 5) + field(2, 0, 1) + named(3, "ps0") + named(4, "ps1")) +
               rec(M["REPORT_PARTIAL"], field(1, 0, 5) + named(3, "bad name")),
    "release": rec(FW, forward(11, 1)) + rec(M["RELEASE_CONTEXT"], field(1, 0, 11) + field(2, 0, 1)) +
               rec(ST, field(1, 0, 11)) + rec(M["RELEASE_CONTEXT"], field(1, 0, 11)) +
               rec(M["RELEASE_CONTEXT"], b""),
    "health": rec(M["HEALTH_CHECK"], named(1, "")) + rec(M["HEALTH_CHECK"], named(1, "ps.ParameterServer")) +
              rec(M["HEALTH_CHECK"], named(1, "other")),
    "tokens": rec(TOKENS, b"# name role token\ntrainer1 trainer 0123456789abcdef0123\nmon reader fedcba9876543210fedc\n"),
    "tokens_bad": rec(TOKENS, b"a trainer short\nb admin 0123456789abcdef0123\n"),
}

# ---- fuzz_config: the shipped configs and a few broken ones
ROOT = os.path.join(HERE, "..", "..")
config_seeds = {}
for name in sorted(os.listdir(os.path.join(ROOT, "configs"))):
    if name.endswith(".yaml"):
        with open(os.path.join(ROOT, "configs", name), "rb") as f:
            config_seeds[name] = f.read()
config_seeds.update({
    "bad_range.yaml": b"server:\n  threads: 0\n",
    "bad_key.yaml": b"server:\n  thread: 4\n",
    "dup.yaml": b"optimizer: {lr: 0.1, lr: 0.2}\n",
    "placement.yaml": b"model:\n  name: rnn_lm\n  placement:\n    emb: {shards: [ps0, ps1/cpu], rows: [10]}\n"
                      b"servers:\n  ps0: {address: '127.0.0.1:1'}\n  ps1: {address: '127.0.0.1:2'}\n",
    "strings.yaml": b"server: {stop_metric: \"a\\\"b\", log_file: \"x\\ty\"}\ncluster: {name: c.1}\n",
    "two_docs.yaml": b"server: {threads: 2}\n---\nserver: {threads: 3}\n",
})


# ---- fuzz_safetensors: small files by the format's rules
def safetensors(tensors, metadata=None):
    """tensors: (name, dtype, shape, raw bytes) in data order."""
    header, off, data = {}, 0, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


st_seeds = {
    "one.safetensors": safetensors([("w", "F32", [2, 3], struct.pack("<6f", *range(6)))]),
    "mixed.safetensors": safetensors([("a", "F64", [2], struct.pack("<2d", 1.5, -2)),
                                      ("b", "I64", [3], struct.pack("<3q", 1, 2, 3)),
                                      ("c", "F32", [], struct.pack("<f", 7))],
                                     {"psd.version": "3", "psd.optimizer": "sgd"}),
    "empty.safetensors": safetensors([("z", "F32", [0, 4], b"")]),
    "bad_offsets.safetensors": safetensors([("w", "F32", [2], struct.pack("<2f", 1, 2))])[:-4],
}

# ---- fuzz_idx: magic 00 00 <type> <ndim>, big-endian dims and elements
def idx(code, shape, raw):
    return struct.pack(">BBBB", 0, 0, code, len(shape)) + b"".join(struct.pack(">I", d) for d in shape) + raw


RAW, GZ = b"\0", b"\1"
imgs = idx(0x08, [2, 3, 3], bytes(range(18)))
idx_seeds = {
    "ubyte3": RAW + imgs,
    "ubyte3_gz": GZ + imgs,
    "labels": RAW + idx(0x08, [5], bytes([0, 1, 2, 9, 7])),
    "int8": RAW + idx(0x09, [4], b"\x80\xff\x00\x7f"),
    "int16": RAW + idx(0x0B, [2, 2], struct.pack(">4h", -1, 2, -300, 32767)),
    "int32": RAW + idx(0x0C, [3], struct.pack(">3i", -1, 2, 1 << 30)),
    "float32": RAW + idx(0x0D, [1, 2], struct.pack(">2f", 1.5, -2)),
    "float64_4d": GZ + idx(0x0E, [1, 1, 1, 2], struct.pack(">2d", 0.25, 1e300)),
    "truncated": RAW + idx(0x08, [100, 100], b"\0" * 10),
    "trailing": RAW + idx(0x08, [2], b"\0" * 5),
    "huge_dims": RAW + idx(0x0E, [0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF], b""),
    "gz_raw": RAW + gzip.compress(imgs, mtime=0),          # a real gzip file, as written (the target leaves it as is)
    "gz_cut": RAW + gzip.compress(imgs, mtime=0)[:-9],     # gzip without its trailer
    "gz_members": RAW + gzip.compress(imgs[:7], mtime=0) + gzip.compress(imgs[7:], mtime=0),  # cat a.gz b.gz
    "gz_junk": RAW + gzip.compress(imgs, mtime=0) + b"JUNK",  # refused (trainer/gzfile.h)
    "gz_zeros": RAW + gzip.compress(imgs, mtime=0) + bytes(8),  # zero padding: ignored, as gzip -d does
}


# ---- fuzz_npy: "\x93NUMPY", version, header length, the dict, the data
def npy(descr, shape, raw, fortran=False, version=1):
    """descr: a dtype string, or a list (a structured dtype, written as Python writes it)."""
    d = "{'descr': %r, 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, repr(tuple(shape)))
    lead = 10 if version == 1 else 12
    h = d.encode() + b" " * (-(lead + len(d) + 1) % 64) + b"\n"
    pre = b"\x93NUMPY" + bytes([version, 0]) + (struct.pack("<H", len(h)) if version == 1 else struct.pack("<I", len(h)))
    return pre + h + raw


npy_seeds = {
    "f4": RAW + npy("<f4", [2, 3], struct.pack("<6f", *range(6))),
    "f4_gz": GZ + npy("<f4", [2, 3], struct.pack("<6f", *range(6))),
    "u1": RAW + npy("|u1", [2, 2, 2], bytes(range(8))),
    "b1": RAW + npy("|b1", [3], b"\0\1\1"),
    "be_i8": RAW + npy(">i8", [2], struct.pack(">2q", -5, 1 << 40)),
    "be_u2": RAW + npy(">u2", [3], struct.pack(">3H", 1, 2, 65535)),
    "i4_v2": RAW + npy("<i4", [2, 1], struct.pack("<2i", 7, -7), version=2),
    "f8_v3": RAW + npy("<f8", [1], struct.pack("<d", 3.5), version=3),
    "v1_5": RAW + npy("<f4", [1], b"\0" * 4)[:7] + b"\x05" + npy("<f4", [1], b"\0" * 4)[8:],  # minor 5: refused
    "f4_gz_junk": RAW + gzip.compress(npy("<f4", [1], b"\0" * 4), mtime=0) + b"\x1f",
    "scalar": RAW + npy("<f4", [], struct.pack("<f", 2.5)),
    "empty": RAW + npy("<f4", [0, 3], b""),
    "fortran1d": RAW + npy("<i2", [2], struct.pack("<2h", 1, 2), fortran=True),
    "fortran2d": RAW + npy("<f4", [2, 2], b"\0" * 16, fortran=True),
    "f2": RAW + npy("<f2", [2], b"\0" * 4),
    "struct": RAW + npy([("a", "<i4")], [1], b"\0" * 4),
    "trunc": RAW + npy("<f8", [4], b"\0" * 8),
    "huge": RAW + npy("<f8", [9999999999, 9999999999], b""),
    "empty_ovf": RAW + npy("<f4", [1, 0, 1 << 62, 4], b""),   # no elements, yet numel's partial products overflow
    "nul": RAW + npy("<f4\0", [1], b"\0" * 4),
    "gz_file": RAW + gzip.compress(npy("<i2", [2], struct.pack("<2h", 1, -1)), mtime=0),  # a .npy.gz as written
}


# ---- fuzz_npz: zip archives of .npy members, stored and deflated (numpy forces zip64)
def npz(members, method=zipfile.ZIP_STORED, force64=True):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=method) as z:
        for name, data in members.items():
            info = zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0))  # a fixed date: the same bytes every run
            info.compress_type = method
            with z.open(info, "w", force_zip64=force64) as f:
                f.write(data)
    return buf.getvalue()


x_npy = npy("<f4", [2, 1, 2, 2], struct.pack("<8f", *range(8)))
y_npy = npy("<i8", [2], struct.pack("<2q", 3, 1))
good_npz = npz({"x_train.npy": x_npy, "y_train.npy": y_npy})


def bomb(name, data, size):
    """A one-member zip: data deflated, its size declared as size in a zip64
    extra field (a zip bomb's header), by hand as the zip spec lays it out."""
    co = zlib.compressobj(9, zlib.DEFLATED, -15)
    comp = co.compress(data) + co.flush()
    n, crc = name.encode(), zlib.crc32(data)
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, 8, 0, 0x21, crc, len(comp), len(data), len(n), 0) + n
    extra = struct.pack("<HHQQ", 1, 16, size, len(comp))
    central = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 0, 8, 0, 0x21, crc, len(comp), 0xFFFFFFFF,
                          len(n), len(extra), 0, 0, 0, 0, 0) + n + extra
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(central), len(local) + len(comp), 0)
    return local + comp + central + end


npz_seeds = {
    "stored.npz": good_npz,
    "deflated.npz": npz({"x.npy": x_npy, "y.npy": y_npy}, zipfile.ZIP_DEFLATED),
    "one.npz": npz({"only.npy": y_npy}, zipfile.ZIP_DEFLATED, force64=False),
    "plain.npz": npz({"a.npy": y_npy}, force64=False),
    "not_npy.npz": npz({"x.npy": b"hello"}),
    "cut.npz": good_npz[:-30],
    # a saturated end record whose zip64 locator points past a 46-byte file
    "zip64_short.npz": b"PK\x03\x04" + struct.pack("<IIQI", 0x07064B50, 0, 1 << 30, 1) +
                       struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0),
    "bomb.npz": bomb("x.npy", x_npy, 1 << 36),  # 64 GiB from ~100 bytes
    "empty.npz": struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0, 0, 0, 0, 0),
}

for target, corpus in (("service", seeds), ("config", config_seeds), ("safetensors", st_seeds),
                       ("idx", idx_seeds), ("npy", npy_seeds), ("npz", npz_seeds)):
    out = os.path.join(HERE, "corpus", target)
    os.makedirs(out, exist_ok=True)
    for name, data in corpus.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print("make_corpus: wrote %d seeds to %s" % (len(corpus), out))
