#!/usr/bin/python3
"""python/psd against PyTorch's local computation, on one psd and on
clusters (tests/it_py_exact.sh runs it; one Python process for all).

    exact.py --data DIR [--rules] [--mnist TARGET LR]... [--lm TARGET LR]...

TARGET: a psd address or a (cluster) config file. --mnist: the checks of
mnist_exact.py (psd freshly started with mnist_cnn, SGD lr LR); --lm: those
of lm_exact.py (rnn_lm, dropout 0, SGD lr LR); --rules: rules.py (the
retry and settle rules against scripted servers, no psd).
"""
import argparse

import torch

import psd
from lm_exact import check_lm
from mnist_exact import check_mnist
import rules


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--rules", action="store_true")
    p.add_argument("--mnist", nargs=2, action="append", default=[], metavar=("TARGET", "LR"))
    p.add_argument("--lm", nargs=2, action="append", default=[], metavar=("TARGET", "LR"))
    p.add_argument("--save", help="torch.save the last --lm model's state_dict (GetParameters) here")
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.rules:
        rules.main()
    for target, lr in a.mnist:
        check_mnist(psd.connect(target, rank=1), a.data, float(lr))
    for target, lr in a.lm:
        client = psd.connect(target, rank=1)
        check_lm(client, float(lr))
        if a.save:
            torch.save(psd.state_dict(client), a.save)


if __name__ == "__main__":
    main()
