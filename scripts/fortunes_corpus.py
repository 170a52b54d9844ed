#!/usr/bin/python3
"""Build a word-level language-modelling corpus (train.txt, valid.txt,
test.txt in Penn Treebank form, as PyTorch's word_language_model reads)
from the fortune cookie files of Debian's `fortunes` package.

    /usr/bin/python3 scripts/fortunes_corpus.py [--src DIR] [--vocab N] OUTDIR

Input: every regular text file directly under DIR (default
/usr/share/games/fortunes), in name order, skipping the binary `.dat`
index files, the `.u8` symlinks and anything else that is a link or not a
file. A file is a list of fortunes separated by lines holding only "%".
Backspace overstrike ("_\\bx", "x\\bx") is reduced to the last character.

Text: lowercased; words are runs of letters and digits, joined by an inner
apostrophe, period or hyphen ("don't", "u.s", "e-mail"); every other
non-space character is a token of its own (PTB-like punctuation). Each
non-blank line of a fortune becomes one line (word_language_model adds
<eos> at each line's end).

Split: fixed, by fortune: fortune number k (counting over all files in
order) goes to valid when k % 20 == 18, to test when k % 20 == 19, else to
train (90/5/5). Vocabulary: as PTB, the N-2 most frequent training words
(ties by first appearance) are kept, every other word of every split is
written as <unk>, so with <eos> and <unk> the vocabulary is at most N
(default 10000, the rnn_lm config's ntoken).

Prints the token count of each split, the vocabulary size and how much of
the training text the vocabulary covers.
"""
import argparse
import collections
import os
import re
import sys

TOKEN = re.compile(r"[^\W_]+(?:['.\-][^\W_]+)*|\S")
OVERSTRIKE = re.compile(r".\x08")


def fortunes(src):
    """Yield each fortune's text, over the files of src in name order."""
    names = sorted(os.listdir(src))
    used = 0
    for name in names:
        path = os.path.join(src, name)
        if name.endswith(('.dat', '.u8')) or os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, 'rb') as f:
            raw = f.read()
        if b'\0' in raw:
            sys.exit(f"{path}: holds NUL bytes: not a fortune text file")
        used += 1
        text = raw.decode('utf-8', errors='replace')
        text = OVERSTRIKE.sub('', text).replace('\x08', '')
        cur = []
        for line in text.split('\n'):
            if line.strip() == '%':
                if cur:
                    yield '\n'.join(cur)
                cur = []
            else:
                cur.append(line)
        if any(s.strip() for s in cur):
            yield '\n'.join(cur)
    if not used:
        sys.exit(f"{src}: no fortune text files (is the fortunes package installed?)")


def lines_of(fortune):
    for line in fortune.lower().split('\n'):
        toks = TOKEN.findall(line)
        if toks:
            yield toks


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--src', default='/usr/share/games/fortunes')
    ap.add_argument('--vocab', type=int, default=10000)
    ap.add_argument('outdir')
    a = ap.parse_args()
    if a.vocab < 3:
        sys.exit("--vocab must be at least 3 (<eos>, <unk> and a word)")
    splits = ([], [], [])
    for k, fort in enumerate(fortunes(a.src)):
        which = 1 if k % 20 == 18 else 2 if k % 20 == 19 else 0
        splits[which].extend(lines_of(fort))
    counts = collections.Counter()
    first = {}
    for toks in splits[0]:
        for t in toks:
            counts[t] += 1
            first.setdefault(t, len(first))
    counts.pop('<unk>', None)
    counts.pop('<eos>', None)
    keep = sorted(counts, key=lambda w: (-counts[w], first[w]))[:a.vocab - 2]
    keep = set(keep)
    os.makedirs(a.outdir, exist_ok=True)
    ntok = []
    for name, lines in zip(('train.txt', 'valid.txt', 'test.txt'), splits):
        n = 0
        tmp = os.path.join(a.outdir, name + '.tmp')
        with open(tmp, 'w', encoding='utf-8') as f:
            for toks in lines:
                f.write(' '.join(t if t in keep else '<unk>' for t in toks) + '\n')
                n += len(toks) + 1
        os.replace(tmp, os.path.join(a.outdir, name))
        ntok.append(n)
    total = sum(counts.values())
    covered = sum(counts[w] for w in keep)
    print(f"fortunes corpus in {a.outdir}: train {ntok[0]} tokens, valid {ntok[1]}, test {ntok[2]} (with <eos>); "
          f"{len(counts)} distinct training words, vocabulary {len(keep) + 2} (with <eos>, <unk>) covers "
          f"{100.0 * covered / max(total, 1):.1f} % of the training words")


if __name__ == '__main__':
    main()
