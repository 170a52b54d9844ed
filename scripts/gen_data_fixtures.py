#!/usr/bin/python3
"""gen_data_fixtures.py DIR - data files for tests/test_dataset.c, written by
numpy (np.save, np.savez, np.savez_compressed, np.lib.format), Python's
zipfile/gzip/struct and PyTorch, the independent writers of the formats
ps-train fit reads (trainer/dataset.h).

For each good file it writes a reference: NAME.ref holds the array's
values as little-endian float64 (.tofile), and a line of DIR/manifest.txt
    good NAME SPEC DTYPE NDIM D0 D1 ...
says which spec to load, the dtype ps-train must report (trainer/array.h
names) and the shape. Files that must be refused get lines
    bad<TAB>NAME<TAB>SPEC<TAB>NEEDLE
with a piece of the error message the loader must give.
"""
import gzip
import io
import json
import os
import struct
import sys
import zipfile

import numpy as np

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
man = open(os.path.join(out, "manifest.txt"), "w")
rng = np.random.default_rng(18)

NAMES = {np.bool_: "bool", np.uint8: "uint8", np.int8: "int8", np.uint16: "uint16", np.int16: "int16",
         np.uint32: "uint32", np.int32: "int32", np.uint64: "uint64", np.int64: "int64", np.float32: "float32",
         np.float64: "float64"}


def path(name):
    return os.path.join(out, name)


def good(name, spec, a):
    a = np.asarray(a)
    a.astype("<f8").tofile(path(name + ".ref"))
    man.write("good %s %s %s %d %s\n" % (name, spec, NAMES[a.dtype.type], a.ndim, " ".join(str(d) for d in a.shape)))


def bad(name, spec, needle):
    man.write("bad\t%s\t%s\t%s\n" % (name, spec, needle))


def sample(dtype, shape):
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        lo, hi = max(info.min, -1000), min(info.max, 1000)
        a = rng.integers(lo, hi, shape).astype(dtype)
        if a.size:  # the extremes that fit a float64 exactly, to catch a wrong width or sign
            a.flat[0] = info.max if info.bits <= 32 else 2 ** 40
            if a.size > 1:
                a.flat[1] = info.min if info.bits <= 32 else (0 if info.min == 0 else -2 ** 40)
        return a
    return (rng.standard_normal(shape) * 100).astype(dtype)


# ---- .npy: every dtype, both byte orders, versions, shapes -------------------
for t in NAMES:
    a = sample(t, (3, 5))
    np.save(path("t_%s.npy" % NAMES[t]), a)
    good("t_%s" % NAMES[t], path("t_%s.npy" % NAMES[t]), a)
for code in (">i4", ">f8", ">u2", ">i8"):
    a = sample(np.dtype(code).type, (4, 3)).astype(code)
    nm = "be_%s" % code[1:]
    np.save(path(nm + ".npy"), a)
    good(nm, path(nm + ".npy"), a.astype(a.dtype.newbyteorder("=")))
imgs = rng.integers(0, 256, (7, 28, 28)).astype(np.uint8)
np.save(path("imgs.npy"), imgs)
good("imgs", path("imgs.npy"), imgs)
np.save(path("scalar.npy"), np.float32(2.5))
good("scalar", path("scalar.npy"), np.float32(2.5))
np.save(path("empty.npy"), np.zeros((0, 3), np.float32))
good("empty", path("empty.npy"), np.zeros((0, 3), np.float32))
a = sample(np.float32, (2, 3, 4, 5, 2, 1, 3, 2))
np.save(path("dims8.npy"), a)
good("dims8", path("dims8.npy"), a)
with open(path("v2.npy"), "wb") as f:
    a = sample(np.int16, (6, 2))
    np.lib.format.write_array(f, a, version=(2, 0))
good("v2", path("v2.npy"), a)
with open(path("v3.npy"), "wb") as f:  # 3.0: 2.0's layout with a UTF-8 header
    a = sample(np.uint32, (3, 4))
    np.lib.format.write_array(f, a, version=(3, 0))
good("v3", path("v3.npy"), a)
# versions numpy never writes (nor reads): a minor other than 0 used to be
# read as its major's layout
v1 = open(path("t_float32.npy"), "rb").read()
open(path("v1_5.npy"), "wb").write(v1[:6] + b"\x01\x05" + v1[8:])
bad("v1_5", path("v1_5.npy"), ".npy format version 1.5 is not supported (1.0, 2.0 and 3.0 are)")
v2 = open(path("v2.npy"), "rb").read()
open(path("v4.npy"), "wb").write(v2[:6] + b"\x04\x00" + v2[8:])
bad("v4", path("v4.npy"), ".npy format version 4.0 is not supported")
open(path("v3_1.npy"), "wb").write(v2[:6] + b"\x03\x01" + v2[8:])
bad("v3_1", path("v3_1.npy"), ".npy format version 3.1 is not supported")
a = sample(np.float64, (5, 4))
with gzip.open(path("gz.npy.gz"), "wb") as f:
    np.save(f, a)
good("gz", path("gz.npy.gz"), a)
# from PyTorch: a tensor saved through numpy
try:
    import torch
    t = torch.arange(24, dtype=torch.int64).reshape(2, 3, 4) * 7 - 30
    np.save(path("torch.npy"), t.numpy())
    good("torch", path("torch.npy"), t.numpy())
except ImportError:
    pass

# refused .npy files
np.save(path("fortran.npy"), np.asfortranarray(sample(np.float32, (3, 4))))
bad("fortran", path("fortran.npy"), "Fortran")
np.save(path("f16.npy"), sample(np.float16, (3,)))
bad("f16", path("f16.npy"), "dtype '<f2' is not supported")
np.save(path("complex.npy"), np.zeros(3, np.complex64))
bad("complex", path("complex.npy"), "dtype '<c8' is not supported")
np.save(path("str.npy"), np.array(["ab", "cd"]))
bad("str", path("str.npy"), "is not supported")
np.save(path("struct.npy"), np.zeros(3, dtype=[("a", "<i4"), ("b", "<f4")]))
bad("struct", path("struct.npy"), "structured")
raw = open(path("t_float32.npy"), "rb").read()
open(path("trunc.npy"), "wb").write(raw[:-4])
bad("trunc", path("trunc.npy"), "truncated")
open(path("trail.npy"), "wb").write(raw + b"\0\0")
bad("trail", path("trail.npy"), "trailing bytes")
open(path("magic.npy"), "wb").write(b"\x93NUMPZ" + raw[6:])
bad("magic", path("magic.npy"), "not a data file")
hdr_bad = raw.replace(b"'shape': (3, 5)", b"'shape': [3, 5]")
open(path("hdr.npy"), "wb").write(hdr_bad)
bad("hdr", path("hdr.npy"), "shape must be a tuple")
open(path("hdr2.npy"), "wb").write(raw.replace(b"'fortran_order'", b"'fortran_ordeR'"))
bad("hdr2", path("hdr2.npy"), "unexpected or repeated key 'fortran_ordeR'")
# a header that declares far more data than the file holds, same length
hdr = raw[10:10 + struct.unpack("<H", raw[8:10])[0]]
huge = hdr.replace(b"(3, 5)", b"(9999, 99999)")
huge = huge[:len(hdr)] if len(huge) >= len(hdr) else huge + b" " * (len(hdr) - len(huge))
huge = huge[:-1] + b"\n"
open(path("huge.npy"), "wb").write(raw[:10] + huge + raw[10 + len(hdr):])
bad("huge", path("huge.npy"), "truncated")
bad("named", path("imgs.npy") + ":x", "names nothing in it")


def npy_raw(dict_text, data=b""):
    """A version 1.0 .npy with this header text, as numpy pads it."""
    h = dict_text.encode("latin1")
    h += b" " * (-(10 + len(h) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h + data


# the magic, then the file ends: a truncated preamble, not "no magic"
open(path("pre8.npy"), "wb").write(raw[:8])
bad("pre8", path("pre8.npy"), "truncated .npy preamble: 8 of its 10 bytes")
# '<f4\0' is not '<f4' (it used to be read as float32)
open(path("nul.npy"), "wb").write(npy_raw("{'descr': '<f4\0', 'fortran_order': False, 'shape': (1,), }", b"\0" * 4))
bad("nul", path("nul.npy"), "a NUL byte in a string")
# an empty array whose other dims multiply past int64: numpy says "array is
# too big"; loaded, its numel and row_numel overflowed
open(path("ovf.npy"), "wb").write(npy_raw("{'descr': '<f4', 'fortran_order': False, "
                                          "'shape': (10, 0, 4611686018427387904, 4611686018427387904), }"))
bad("ovf", path("ovf.npy"), "the product of the dimensions overflows int64")

# ---- .npz: stored and deflated, zip64 members (numpy forces zip64) ---------
x = sample(np.float32, (10, 1, 4, 4))
y = rng.integers(0, 10, 10).astype(np.int64)
np.savez(path("d.npz"), x_train=x, y_train=y)
good("npz_x", path("d.npz") + ":x_train", x)
good("npz_y", path("d.npz") + ":y_train.npy", y)
np.savez_compressed(path("c.npz"), x=x, y=y.astype(np.uint8))
good("npzc_x", path("c.npz") + ":x", x)
good("npzc_y", path("c.npz") + ":y", y.astype(np.uint8))
np.savez_compressed(path("one.npz"), only=imgs)
good("npz_one", path("one.npz"), imgs)
bad("npz_missing", path("d.npz") + ":nope", "no array 'nope' (arrays: x_train.npy, y_train.npy)")
bad("npz_unnamed", path("d.npz"), "holds 2 arrays")
cz = open(path("c.npz"), "rb").read()
open(path("cut.npz"), "wb").write(cz[:len(cz) - 30])
bad("npz_cut", path("cut.npz"), "no end-of-central-directory record")
# a flipped byte in the middle of member x's deflate data
zi = zipfile.ZipFile(path("c.npz")).getinfo("x.npy")
loc = zi.header_offset
nl, xl = struct.unpack("<HH", cz[loc + 26:loc + 30])
mid = loc + 30 + nl + xl + zi.compress_size // 2
open(path("flip.npz"), "wb").write(cz[:mid] + bytes([cz[mid] ^ 0x55]) + cz[mid + 1:])
bad("npz_flip", path("flip.npz") + ":x", "npz")  # CRC or deflate error, both name the file
sz = open(path("d.npz"), "rb").read()
zi = zipfile.ZipFile(path("d.npz")).getinfo("x_train.npy")
loc = zi.header_offset
nl, xl = struct.unpack("<HH", sz[loc + 26:loc + 30])
mid = loc + 30 + nl + xl + zi.compress_size - 3
open(path("flip2.npz"), "wb").write(sz[:mid] + bytes([sz[mid] ^ 0x01]) + sz[mid + 1:])
bad("npz_crc", path("flip2.npz") + ":x_train", "CRC-32")
with zipfile.ZipFile(path("bz.npz"), "w", compression=zipfile.ZIP_BZIP2) as z:
    buf = io.BytesIO()
    np.save(buf, x)
    z.writestr("x.npy", buf.getvalue())
bad("npz_bzip2", path("bz.npz") + ":x", "method 12 (bzip2)")
# a deflated member that declares 4 GiB from a few bytes: refused before
# allocating it (it used to malloc the 4 GiB, then inflate what is there)
cdir = cz.index(b"PK\x01\x02")
while cz[cdir + 46:cdir + 46 + struct.unpack("<H", cz[cdir + 28:cdir + 30])[0]] != b"y.npy":
    cdir = cz.index(b"PK\x01\x02", cdir + 4)
bomb = bytearray(cz)
struct.pack_into("<I", bomb, cdir + 24, 0xFFFFFFFE)
open(path("bomb.npz"), "wb").write(bytes(bomb))
bad("npz_bomb", path("bomb.npz") + ":y", "more than deflate can produce")
# a saturated end record whose zip64 locator points past a 46-byte file (it
# used to read there: a crash)
open(path("zip64short.npz"), "wb").write(
    b"PK\x03\x04" + struct.pack("<IIQI", 0x07064B50, 0, 1 << 30, 1) +
    struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0))
bad("npz_zip64short", path("zip64short.npz"), "no zip64 end record where its locator points")
np.savez(path("noarrays.npz"))
bad("npz_empty", path("noarrays.npz"), "an archive without arrays")
with zipfile.ZipFile(path("notnpy.npz"), "w") as z:
    z.writestr("x.npy", b"hello, not an array")
bad("npz_notnpy", path("notnpy.npz") + ":x", "not a .npy file")

# ---- IDX: every type, big-endian, raw and gzip'ed -------------------------
def idx(name, code, a, gz=False):
    data = struct.pack(">BBBB", 0, 0, code, a.ndim) + b"".join(struct.pack(">I", d) for d in a.shape)
    data += a.astype(a.dtype.newbyteorder(">")).tobytes()
    (gzip.open if gz else open)(path(name), "wb").write(data)


for code, t in ((0x08, np.uint8), (0x09, np.int8), (0x0B, np.int16), (0x0C, np.int32), (0x0D, np.float32),
                (0x0E, np.float64)):
    a = sample(t, (4, 3, 2))
    idx("idx_%02x" % code, code, a)
    good("idx_%02x" % code, path("idx_%02x" % code), a)
    idx("idx_%02x.gz" % code, code, a, gz=True)
    good("idxgz_%02x" % code, path("idx_%02x.gz" % code), a)
lab = rng.integers(0, 10, 9).astype(np.uint8)
idx("labels-idx1-ubyte", 0x08, lab)
good("idx_labels", path("labels-idx1-ubyte"), lab)
open(path("idx_badtype"), "wb").write(b"\0\0\x0a\x01\0\0\0\x02ab")
bad("idx_badtype", path("idx_badtype"), "not a data file")
# small gzip files cut or corrupted: zlib gives no bytes at all, which used
# to read as "not a data file"
gzd = gzip.compress(struct.pack(">BBBBI", 0, 0, 0x08, 1, 300) + bytes(range(256)) + bytes(44), mtime=0)
open(path("gzcut"), "wb").write(gzd[:12])
bad("gz_cut", path("gzcut"), "a gzip file that does not decompress (zlib: unexpected end of file)")
open(path("gzcrc"), "wb").write(gzd[:-8] + bytes([gzd[-8] ^ 0xFF]) + gzd[-7:])
bad("gz_crc", path("gzcrc"), "does not decompress (zlib: incorrect data check)")
# gzip members concatenated (cat a.gz b.gz, which gzip -d reads as one) are
# one stream; zero bytes after the last member are ignored as gzip -d does;
# other bytes after it are refused (zlib used to stop there silently; gzip -d
# warns "trailing garbage ignored")
a = sample(np.uint8, (6, 5))
ida = struct.pack(">BBBBII", 0, 0, 0x08, 2, 6, 5) + a.tobytes()
open(path("idx_multi.gz"), "wb").write(gzip.compress(ida[:11], mtime=0) + gzip.compress(ida[11:], mtime=0))
good("idx_multi", path("idx_multi.gz"), a)
open(path("idx_zpad.gz"), "wb").write(gzip.compress(ida, mtime=0) + bytes(512))
good("idx_zpad", path("idx_zpad.gz"), a)
gza = gzip.compress(ida, mtime=0)
open(path("idx_junk.gz"), "wb").write(gza + b"JUNK\n")
bad("idx_junk", path("idx_junk.gz"), "5 bytes after the end of the gzip data (byte %d, after 1 member) are not gzip"
    % len(gza))
open(path("idx_zjunk.gz"), "wb").write(gza + bytes(3) + b"x")
bad("idx_zjunk", path("idx_zjunk.gz"), "4 bytes after the end of the gzip data")
b = io.BytesIO()
np.save(b, a)
gzb = gzip.compress(b.getvalue()[:40], mtime=0) + gzip.compress(b.getvalue()[40:], mtime=0)
open(path("npy_multi.npy.gz"), "wb").write(gzb)
good("npy_multi", path("npy_multi.npy.gz"), a)
open(path("npy_junk.npy.gz"), "wb").write(gzb + b"\x1f")
bad("npy_junk", path("npy_junk.npy.gz"), "1 byte after the end of the gzip data (byte %d, after 2 members)"
    % len(gzb))
os.makedirs(path("adir"), exist_ok=True)
bad("dir", path("adir"), "a directory, not a data file")
open(path("idx_trunc"), "wb").write(struct.pack(">BBBBI", 0, 0, 0x0D, 1, 5) + b"\0" * 12)
bad("idx_trunc", path("idx_trunc"), "need 20 bytes, got 12")

# ---- safetensors: the spec's layout (header length, JSON, data) -----------
def safetensors(name, tensors, meta=None):
    hdr, blobs, off = {}, [], 0
    for k, (dt, a) in tensors.items():
        b = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()
        hdr[k] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if meta:
        hdr["__metadata__"] = meta
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    open(path(name), "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


st_x = rng.integers(0, 256, (6, 1, 5, 5)).astype(np.uint8)
st_y = rng.integers(0, 3, 6).astype(np.int32)
st_f = sample(np.float32, (6, 2))
st_l = sample(np.int64, (6,))
st_b = sample(np.bool_, (2, 2))
safetensors("d.safetensors", {"images": ("U8", st_x), "labels": ("I32", st_y), "feat": ("F32", st_f),
                              "ids": ("I64", st_l), "mask": ("BOOL", st_b), "small": ("I8", sample(np.int8, (3,))),
                              "u16": ("U16", sample(np.uint16, (3,)))}, {"source": "gen_data_fixtures.py"})
good("st_images", path("d.safetensors") + ":images", st_x)
good("st_labels", path("d.safetensors") + ":labels", st_y)
good("st_feat", path("d.safetensors") + ":feat", st_f)
good("st_ids", path("d.safetensors") + ":ids", st_l)
good("st_mask", path("d.safetensors") + ":mask", st_b)
safetensors("one.safetensors", {"x": ("F64", sample(np.float64, (2, 3)))})
bad("st_missing", path("d.safetensors") + ":nope", "no tensor 'nope'")
bad("st_unnamed", path("d.safetensors"), "holds 7 tensors")
safetensors("bf16.safetensors", {"x": ("BF16", np.zeros(4, np.uint16))})
bad("st_bf16", path("bf16.safetensors") + ":x", "unsupported dtype \"BF16\"")
# an empty array whose other dims overflow int64, as in ovf.npy
h = json.dumps({"x": {"dtype": "F32", "shape": [10, 0, 2 ** 62, 2 ** 62], "data_offsets": [0, 0]}}).encode()
open(path("ovf.safetensors"), "wb").write(struct.pack("<Q", len(h)) + h)
bad("st_ovf", path("ovf.safetensors"), "the product of the dimensions overflows int64")
# a header length over what is read: say it may be one
open(path("hlen.safetensors"), "wb").write(struct.pack("<Q", 1 << 40) + b'{"x": 1}')
bad("st_hlen", path("hlen.safetensors"), "a safetensors header of 1099511627776 bytes?")
open(path("text.txt"), "w").write("label,pixel0\n1,0\n")
bad("text", path("text.txt"), "not a data file")
open(path("empty.bin"), "w").close()
bad("emptyfile", path("empty.bin"), "empty file")
bad("nofile", path("does-not-exist.npy"), "cannot open")
# ':' in file names: the whole argument when a file has that name, else
# FILE:NAME split at the last ':'; neither names both readings (it used to
# say only "DIR/run-13: cannot open")
a = sample(np.int16, (2, 3))
np.save(path("run-12:00.npy"), a)
good("colon_file", path("run-12:00.npy"), a)
np.savez(path("data:v2.npz"), x_train=a, y_train=a[:, 0])
good("colon_npz", path("data:v2.npz") + ":x_train", a)
bad("colon_neither", path("run-13:00.npy"), "run-13:00.npy: no such file, and read as FILE:NAME (split at the last "
    "':') neither is %s, the file to take '00.npy' from" % path("run-13"))
man.close()
