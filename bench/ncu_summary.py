#!/usr/bin/env python3
"""ncu_summary.py - per-kernel GPU time from Nsight Compute's CSV.

    ncu --clock-control none --metrics gpu__time_duration.sum --csv PROGRAM ... > k.csv
    bench/ncu_summary.py k.csv

prints one line per kernel name (in first-seen order): how many launches and
their mean time in microseconds - what scripts/gpu-check.sh PROFILE=1 shows
for bench_cuda_ops' convolution rows (where a call's GPU time goes: e.g. on
an H200, cuDNN's deterministic weight-gradient kernel took 335 us of conv2's
backward). Lines before the CSV header (the program's own output, ncu's
notes) are skipped."""
import collections
import csv
import sys

UNIT_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def main(path):
    rows = [r for r in csv.reader(open(path, newline="")) if len(r) > 10]
    if not rows or "Kernel Name" not in rows[0]:
        sys.exit(f"ncu_summary: {path}: no ncu CSV header (Kernel Name, Metric Unit, Metric Value)")
    h = rows[0]
    ki, ui, vi = h.index("Kernel Name"), h.index("Metric Unit"), h.index("Metric Value")
    agg = collections.OrderedDict()
    for r in rows[1:]:
        scale = UNIT_US.get(r[ui])
        if scale is None:
            sys.exit(f"ncu_summary: {path}: unknown unit {r[ui]!r}")
        a = agg.setdefault(r[ki], [0, 0.0])
        a[0] += 1
        a[1] += float(r[vi].replace(",", "")) * scale
    for name, (n, t) in agg.items():
        print(f"{n:5d} x {t / n:9.1f} us  {name[:110]}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: ncu_summary.py NCU_CSV")
    main(sys.argv[1])
