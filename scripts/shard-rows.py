#!/usr/bin/python3
"""Choose the row boundaries of a sharded embedding table so that each shard
gets about the same share of the training tokens (model.placement.<stage>.rows).

    scripts/shard-rows.py CORPUS_DIR N [NTOKEN]

Reads CORPUS_DIR/train.txt the way `ps-train lm` does (trainer/lm_corpus.c):
lines split at '\\n'; words are runs of bytes between ' ', '\\t', '\\r', '\\f'
and '\\v'; each line ends with an <eos> token; ids are given in order of first
appearance in train.txt (<eos> after the first line's words), and <unk> gets
the next id after the training text unless train.txt holds the word itself.
The traffic of a row is taken as its number of occurrences in train.txt.

Prints the N-1 inner boundaries B1 < ... < B(N-1) (shard k holds rows
[B_k, B_{k+1}), B_0 = 0, B_N = NTOKEN) that split the occurrences into N
nearly equal parts - a single row is never split, so a very frequent word
can leave one part larger - once as YAML and once as ps-train/psd flags:

    rows: [a, b]
    --set model.placement.emb.rows=a,b

and, on stderr, each shard's rows and share of the tokens. NTOKEN (the
table's rows, model.sizes.ntoken) defaults to the vocabulary size; it must be
at least that and at least N.
"""
import re
import sys

SPACE = re.compile(rb"[ \t\r\f\v]+")


def counts(path):
    """Occurrences per id, ids in ps-train lm's order."""
    with open(path, "rb") as f:
        text = f.read()
    ids, cnt = {}, []

    def add(w):
        i = ids.get(w)
        if i is None:
            i = ids[w] = len(cnt)
            cnt.append(0)
        cnt[i] += 1

    lines = text.split(b"\n")
    if text.endswith(b"\n"):
        lines.pop()
    for line in lines:
        for w in SPACE.split(line):
            if w:
                add(w)
        add(b"<eos>")
    if b"<unk>" not in ids:
        ids[b"<unk>"] = len(cnt)
        cnt.append(0)
    return cnt


def boundaries(cnt, n, rows):
    """n-1 strictly increasing boundaries in 1..rows-1, each the cut whose
    prefix of occurrences is nearest k/n of the total."""
    cum = [0]
    for c in cnt:
        cum.append(cum[-1] + c)
    cum += [cum[-1]] * (rows - len(cnt))   # rows past the vocabulary: no traffic
    total = cum[-1]
    out = []
    for k in range(1, n):
        target = total * k / n
        lo = out[-1] + 1 if out else 1          # above the previous boundary
        hi = rows - (n - k)                     # room for the shards after it
        b = lo
        # smallest b in [lo, hi] with cum[b] >= target, then the nearer of b-1 and b
        a, z = lo, hi
        while a < z:
            m = (a + z) // 2
            if cum[m] >= target:
                z = m
            else:
                a = m + 1
        b = a
        if b > lo and abs(cum[b - 1] - target) <= abs(cum[b] - target):
            b -= 1
        out.append(b)
    return out, cum


def main(argv):
    if len(argv) not in (3, 4) or argv[1] in ("-h", "--help"):
        sys.stderr.write(__doc__)
        return 2
    corpus, n = argv[1], int(argv[2])
    try:
        cnt = counts(corpus.rstrip("/") + "/train.txt")
    except OSError as e:
        sys.exit(f"shard-rows: {e}")
    rows = int(argv[3]) if len(argv) == 4 else len(cnt)
    if n < 2:
        sys.exit("shard-rows: N must be at least 2 (one shard needs no boundaries)")
    if rows < len(cnt):
        sys.exit(f"shard-rows: NTOKEN {rows} is below the vocabulary of {len(cnt)} words (ps-train lm would refuse it)")
    if rows < n:
        sys.exit(f"shard-rows: {n} shards need at least {n} rows, NTOKEN is {rows}")
    b, cum = boundaries(cnt, n, rows)
    total = cum[-1]
    edges = [0] + b + [rows]
    for k in range(n):
        share = (cum[edges[k + 1]] - cum[edges[k]]) / total if total else 0
        sys.stderr.write(f"shard {k + 1}: rows [{edges[k]}, {edges[k + 1]}) {100 * share:.1f} % of {total} tokens\n")
    print("rows: [" + ", ".join(map(str, b)) + "]")
    print("--set model.placement.emb.rows=" + ",".join(map(str, b)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
