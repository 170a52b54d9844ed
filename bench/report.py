#!/usr/bin/python3
"""The table of `make bench` from the raw results bench/run.sh wrote.

usage: bench/report.py RESULTS_DIR
"""
import glob
import os
import re
import statistics
import sys

KV = re.compile(r"(\w+)=(\S+)")


def kv(line):
    return dict(KV.findall(line))


def pct(vals, p):
    if not vals:
        return float("nan")
    s = sorted(vals)
    return s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))]


def read(path):
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def read_e2e(dd, n):
    """One e2e run directory of n trainers: the combined samples/s of each
    repetition where all n trainers reported, the RPC and probe latencies (ms)
    and the wall seconds per batch."""
    runs, rpcs, probes, walls = {}, {}, {}, []
    for f in sorted(glob.glob(os.path.join(dd, "rep*-t*.txt"))):
        rep = os.path.basename(f).split("-")[0]
        for line in read(f):
            if line.startswith("trainer "):
                k = kv(line)
                runs.setdefault(rep, []).append((int(k["samples"]), float(k["t_start"]), float(k["t_end"])))
                walls.append(float(k["wall_s"]) / int(k["batches"]))
            elif line.startswith("probe "):
                _, name, tot = line.split()
                probes.setdefault(name, []).append(float(tot) / 1e3)
            elif line.startswith("rpc "):
                _, name, tot, call, ser = line.split()
                r = rpcs.setdefault(name, {"tot": [], "call": [], "ser": []})
                r["tot"].append(float(tot) / 1e3)
                r["call"].append(float(call) / 1e3)
                r["ser"].append(float(ser) / 1e3)
    rates = [sum(t[0] for t in tr) / (max(t[2] for t in tr) - min(t[1] for t in tr))
             for tr in runs.values() if len(tr) == n]
    return rates, rpcs, probes, walls


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    d = sys.argv[1]
    print("=" * 78)
    print("psd benchmark -", os.path.basename(d.rstrip("/")))
    print("=" * 78)
    for line in read(os.path.join(d, "machine.txt")):
        print(line)

    # ---- compute
    comp, phases, last, isa_of = {}, {}, None, {}
    for line in read(os.path.join(d, "compute.txt")):
        if line.startswith("compute "):
            k = kv(line)
            last = (k["backend"], int(k["threads"]), k["what"])
            isa_of[k["backend"]] = k.get("isa", "?")
            comp[last] = (float(k["median"]), float(k["min"]), float(k["max"]))
        elif "phases" in line and last:
            m = re.findall(r"(forward|backward|step) ([0-9.]+)", line)
            phases[last] = {a: float(b) for a, b in m}
    print()
    print("1. Compute only, in-process (batch 32; samples/s, median of reps [min..max])")
    print(f"   {'backend':<11} {'threads':>7}  {'forward':>22}  {'training step':>22}  step phases ms: fwd/bwd/sgd")
    for be in ("dnnl", "dnnl-plain", "ref"):
        for t in (1, 2):
            f, s = comp.get((be, t, "forward")), comp.get((be, t, "step"))
            if not f or not s:
                continue
            ph = phases.get((be, t, "step"), {})
            print(f"   {be:<11} {t:>7}  {f[0]:>8.0f} [{f[1]:>5.0f}..{f[2]:>5.0f}]  {s[0]:>8.0f} [{s[1]:>5.0f}..{s[2]:>5.0f}]"
                  f"  {ph.get('forward', 0):.2f}/{ph.get('backward', 0):.2f}/{ph.get('step', 0):.2f}")

    # ---- end to end
    print()
    print("2. End to end: psd + N trainers (bench_trainer processes) on loopback")
    print("   mode: split = Forward, Backward, Step; fused = Forward, Backward(step=true);"
          " plain-layout = split with PS_DNNL_LAYOUT=plain")
    print(f"   {'mode':<13} {'trainers':>8} {'total samples/s':>16} {'runs':>14} {'psd peak RSS':>13}")
    e2e = {}
    lat = {}
    probe = {}
    for dd in sorted(glob.glob(os.path.join(d, "e2e-*"))):
        m = re.match(r"e2e-(.+)-(\d+)$", os.path.basename(dd))
        if not m:
            continue
        label, n = m.group(1), int(m.group(2))
        rates, rpcs, probes, walls = read_e2e(dd, n)
        rss = ""
        for line in read(os.path.join(dd, "psd_rss.txt")):
            rss = f"{int(line.split()[1]) / 1024:.0f} MiB"
        if probes:
            probe[n] = (probes, statistics.median(walls), rpcs)
            continue
        if rates:
            e2e[(label, n)] = statistics.median(rates)
            lat[(label, n)] = (rpcs, statistics.median(walls))
            rr = "/".join(f"{r:.0f}" for r in rates)
            print(f"   {label:<13} {n:>8} {statistics.median(rates):>16.0f} {rr:>14} {rss:>13}")

    print()
    print("   Latency per RPC, ms (client side; all runs and trainers). ser = the client's encode + decode;")
    print("   call = transport + psd (decode, compute, encode, waiting for a core and the weights lock);")
    print("   compute = the in-process time of that phase with the threads psd gives a call (2 threads alone,")
    print("   1 with 2+ trainers); rest = call - compute: transport, psd's decode/encode and the waits")
    print(f"   {'mode':<7} {'N':>2} {'rpc':<14} {'p50':>7} {'p99':>7} {'ser p50':>8} {'call p50':>9} {'compute':>8} {'rest':>7}")
    for (label, n), (rpcs, wall) in sorted(lat.items()):
        if label not in ("split", "fused"):
            continue
        t = 2 if n == 1 else 1
        ph = phases.get(("dnnl", t, "step"), {})
        est = {"Forward": ph.get("forward", 0), "Backward": ph.get("backward", 0), "Step": ph.get("step", 0),
               "Backward+Step": ph.get("backward", 0) + ph.get("step", 0)}
        for name in ("Forward", "Backward", "Backward+Step", "Step"):
            r = rpcs.get(name)
            if not r:
                continue
            p50 = statistics.median(r["tot"])
            rest = statistics.median(r["call"]) - est[name]
            print(f"   {label:<7} {n:>2} {name:<14} {p50:>7.2f} {pct(r['tot'], 99):>7.2f} {statistics.median(r['ser']):>8.3f}"
                  f" {statistics.median(r['call']):>9.2f} {est[name]:>8.2f} {rest:>7.2f}")
    print()
    print("   RPC + serialisation share of a training step (split mode): the same three RPCs sent so that psd")
    print("   refuses them after decoding, before any compute (bench_trainer --probe: Forward with the batch and")
    print("   context 0, Backward and Step of an unknown context), p50, over the batch's wall time in that run")
    overhead = {}
    for n, (pr, wall, rpcs) in sorted(probe.items()):
        parts = {k: statistics.median(v) for k, v in pr.items()}
        ov = sum(parts.values())
        overhead[n] = ov / (wall * 1e3)
        print(f"   {n} trainer(s): Forward {parts.get('Forward', 0):.3f} + Backward {parts.get('Backward', 0):.3f}"
              f" + Step {parts.get('Step', 0):.3f} = {ov:.3f} ms of {wall * 1e3:.2f} ms per batch"
              f" = {100 * ov / (wall * 1e3):.1f}% (p99 Forward probe {pct(pr.get('Forward', []), 99):.3f} ms)")

    # ---- anchors
    torch, torch_isa, torch_caps = {}, {}, {}
    for line in read(os.path.join(d, "torch.txt")):
        if line.startswith("torch "):
            k = kv(line)
            caps = f"{k.get('aten', '?')} / {k.get('onednn_max', '?')}"
            if "isa" in k:  # section 4: capped to an emulated ISA
                torch_isa[(k["isa"], int(k["threads"]))] = float(k["median"])
                torch_caps[k["isa"]] = caps
            else:
                torch[(k["what"], int(k["threads"]))] = float(k["median"])
                torch_caps["host"] = caps
    print()
    print("3. Anchors: PyTorch (Debian python3-torch) on the same IDX data, batch 32, samples/s")
    for (what, t), v in sorted(torch.items()):
        name = "RPC parameter-server tutorial, PS + 1 trainer" if what == "tutorial" else "plain local training loop"
        print(f"   {name:<48} torch threads={t}: {v:8.0f}  (ATen / oneDNN cap: {torch_caps.get('host', '')})")
    tut = max([v for (w, _), v in torch.items() if w == "tutorial"], default=None)
    loc = max([v for (w, _), v in torch.items() if w == "local"], default=None)

    print()
    print("4. Ratios (ours / theirs; against the faster of PyTorch's thread settings)")
    ratios = []
    if tut:
        for key, what in ((("split", 1), "psd + 1 trainer"), (("split", 2), "psd + 2 trainers"),
                          (("fused", 2), "psd + 2 trainers, fused step"), (("split", 4), "psd + 4 trainers")):
            if key in e2e:
                ratios.append((f"{what} / PyTorch tutorial (1 trainer)", e2e[key] / tut))
    if loc:
        for t in (1, 2):
            if ("dnnl", t, "step") in comp:
                ratios.append((f"in-process step, dnnl {t} thread(s) / PyTorch local loop", comp[("dnnl", t, "step")][0] / loc))
        if ("split", 2) in e2e:
            ratios.append(("psd + 2 trainers / PyTorch local loop", e2e[("split", 2)] / loc))
    for name, r in ratios:
        print(f"   {name:<62} {r:6.2f}x")
    if not torch:
        print("   (PyTorch anchors skipped)")

    print()
    print("5. Targets")
    def verdict(ok):
        return "MET" if ok else "NOT MET"
    if ("dnnl", 2, "step") in comp:
        v = comp[("dnnl", 2, "step")][0]
        print(f"   in-process training step, 2 threads >= 900 samples/s: {v:.0f}  {verdict(v >= 900)}")
    if ("split", 2) in e2e:
        v = e2e[("split", 2)]
        print(f"   psd + 2 trainers >= 800 samples/s total: {v:.0f}  {verdict(v >= 800)}")
        if tut:
            print(f"   psd + 2 trainers >= 4x the PyTorch tutorial: {v / tut:.1f}x  {verdict(v / tut >= 4)}")
    if 2 in overhead:
        share = 100 * overhead[2]
        print(f"   RPC + serialisation <= 15% of a step (2 trainers, probe): {share:.1f}%  {verdict(share <= 15)}")
    print("   accuracy unchanged: checked by `make test` (it_train, >= 90% for both trainers), not here")

    per_isa(d, comp, phases, isa_of, e2e, torch, torch_isa, torch_caps)
    resnet(os.path.join(d, "resnet"))


def resnet(d):
    """Section 7: the small ResNet model file (bench/run.sh section 4b), per ISA."""
    comp, phases, isa_of, order, last = {}, {}, {}, [], None
    for line in read(os.path.join(d, "compute.txt")):
        if line.startswith("compute "):
            k = kv(line)
            col = k["backend"].split("@", 1)[1] if "@" in k["backend"] else "host"
            if col not in order:
                order.append(col)
            isa_of[col] = k.get("isa", "?")
            last = (col, int(k["threads"]), k["what"])
            comp[last] = float(k["median"])
        elif "phases" in line and last:
            phases[last] = {a: float(b) for a, b in re.findall(r"(forward|backward|step) ([0-9.]+)", line)}
    if not order:
        return
    e2e = {}
    for col in order:
        rates = read_e2e(os.path.join(d, f"e2e-{col}-2"), 2)[0]
        if rates:
            e2e[col] = statistics.median(rates)
    print()
    print("7. The small ResNet (examples/models/small_resnet.yaml: conv, BatchNorm, residual Adds, pooling, linear)")
    print("   on the MNIST images, batch 32, samples/s; psd serving it to 2 bench_trainer processes (bench/run.sh 4b)")
    w = 24
    print(f"   {'':<50}" + "".join(f"{isa_of[c] + (' (host)' if c == 'host' else ' (emul.)'):>{w}}" for c in order))

    def row(label, vals, fmt="{:.0f}"):
        print(f"   {label:<50}" + "".join(f"{(fmt.format(v) if isinstance(v, (int, float)) else (v or '-')):>{w}}"
                                         for v in vals))

    def ratio(a, b):
        return a / b if a and b else None

    res = {c: {} for c in order}
    for t in (1, 2):
        f = [comp.get((c, t, "forward")) for c in order]
        st = [comp.get((c, t, "step")) for c in order]
        row(f"in-process forward, {t} thread(s)", f)
        row(f"in-process training step, {t} thread(s)", st)
        row("  step / forward (target >= 0.30)", [ratio(a, b) for a, b in zip(st, f)], "{:.2f}")
        ph = [phases.get((c, t, "step"), {}) for c in order]
        row(f"  step phases fwd/bwd/sgd ms, {t} thread(s)",
            [f"{p.get('forward', 0):.1f}/{p.get('backward', 0):.1f}/{p.get('step', 0):.2f}" if p else None for p in ph])
        for c, a, b in zip(order, st, f):
            res[c][f"sf{t}"] = ratio(a, b)
    e = [e2e.get(c) for c in order]
    st1 = [comp.get((c, 1, "step")) for c in order]
    row("psd + 2 trainers, total", e)
    row("  / (2 x in-process step, 1 thread) (target >= 0.85)",
        [ratio(a, 2 * b) if b else None for a, b in zip(e, st1)], "{:.2f}")
    row("psd start-up: reference kernels logged",
        [fallbacks_logged(d, c) for c in order], "{:d}")
    print()
    print("   Targets (issue 18)")
    for i, c in enumerate(order):
        vs = ratio(e[i], 2 * st1[i]) if st1[i] else None
        for what, v, goal in (("step/forward 1 thread >= 0.30", res[c].get("sf1"), 0.30),
                              ("step/forward 2 threads >= 0.30", res[c].get("sf2"), 0.30),
                              ("psd + 2 trainers >= 0.85 x (2 x 1-thread step)", vs, 0.85)):
            if v is not None:
                print(f"   {isa_of[c]:<18} {what:<54} {v:6.2f}  {'MET' if v >= goal else 'NOT MET'}")


def fallbacks_logged(d, label):
    """Reference-kernel lines psd logged at start-up in that e2e run (None: no log)."""
    lines = read(os.path.join(d, f"e2e-{label}-2", "psd.log"))
    if not lines:
        return None
    return sum("reference kernel:" in line for line in lines)


def per_isa(d, comp, phases, isa_of, e2e, torch, torch_isa, torch_caps):
    """Section 6: the host's ISA and each emulated one side by side, with issue 10's targets."""
    cols = [("host", "dnnl", ("split", 2), lambda t: torch.get(("tutorial", t)))]
    for be in sorted(b for b in isa_of if b.startswith("dnnl@")):
        low = be.split("@", 1)[1]
        cols.append((low, be, (f"isa@{low}", 2), lambda t, low=low: torch_isa.get((low, t))))
    if ("dnnl", 1, "step") not in comp:
        return
    print()
    print("6. Per ISA (batch 32, samples/s). host = the CPU's own ISA; the others are emulated with")
    print("   ONEDNN_MAX_CPU_ISA (oneDNN only; same cores, same memory), PyTorch capped the same way.")
    heads = [f"{isa_of.get(be, '?')}{' (host)' if name == 'host' else ' (emul.)'}" for name, be, _, _ in cols]
    w = 24
    print(f"   {'':<44}" + "".join(f"{h:>{w}}" for h in heads))

    def row(label, vals, fmt="{:.0f}"):
        print(f"   {label:<44}" + "".join(f"{(fmt.format(v) if isinstance(v, (int, float)) else (v or '-')):>{w}}"
                                         for v in vals))

    def med(key):
        v = comp.get(key)
        return v[0] if v else None

    def ratio(a, b):
        return a / b if a and b else None

    res = {}
    for t in (1, 2):
        f = [med((be, t, "forward")) for _, be, _, _ in cols]
        st = [med((be, t, "step")) for _, be, _, _ in cols]
        row(f"in-process forward, {t} thread(s)", f)
        row(f"in-process training step, {t} thread(s)", st)
        row(f"  step / forward (target >= 0.30)", [ratio(a, b) for a, b in zip(st, f)], "{:.2f}")
        ph = [phases.get((be, t, "step"), {}) for _, be, _, _ in cols]
        row(f"  step phases fwd/bwd/sgd ms, {t} thread(s)",
            [f"{p.get('forward', 0):.1f}/{p.get('backward', 0):.1f}/{p.get('step', 0):.2f}" if p else None for p in ph])
        for (name, _, _, _), a, b in zip(cols, st, f):
            res.setdefault(name, {})[f"ratio{t}"] = ratio(a, b)
    e = [e2e.get(key) for _, _, key, _ in cols]
    st2 = [med((be, 2, "step")) for _, be, _, _ in cols]
    row("psd + 2 trainers, total", e)
    row("  / in-process step, 2 threads (target >= 0.85)", [ratio(a, b) for a, b in zip(e, st2)], "{:.2f}")
    row("psd start-up: reference kernels logged", [fallbacks_logged(d, key[0]) for _, _, key, _ in cols], "{:d}")
    tut = [[fn(t) for _, _, _, fn in cols] for t in (1, 2)]
    row("PyTorch tutorial, 1 / 2 torch threads",
        [f"{a:.0f} / {b:.0f}" if a and b else None for a, b in zip(tut[0], tut[1])])
    row("  PyTorch's ISA: ATen / oneDNN cap", [torch_caps.get(name) for name, _, _, _ in cols])
    best = [max([v for v in (a, b) if v], default=None) for a, b in zip(tut[0], tut[1])]
    row("psd + 2 trainers / PyTorch tutorial", [ratio(a, b) for a, b in zip(e, best)], "{:.1f}x")
    print()
    print("   Targets (issue 10)")
    for i, (name, be, key, _) in enumerate(cols):
        isa = isa_of.get(be, "?")
        r1, r2 = res[name].get("ratio1"), res[name].get("ratio2")
        vs = ratio(e[i], st2[i])
        for what, v, goal in ((f"step/forward 1 thread >= 0.30", r1, 0.30), (f"step/forward 2 threads >= 0.30", r2, 0.30),
                              ("psd + 2 trainers >= 0.85 x in-process 2-thread step", vs, 0.85)):
            if v is not None:
                print(f"   {isa:<18} {what:<54} {v:6.2f}  {'MET' if v >= goal else 'NOT MET'}")
        if isa.startswith("avx2") and ratio(e[i], best[i]) is not None:
            v = ratio(e[i], best[i])
            print(f"   {isa:<18} {'psd + 2 trainers >= 3.5 x PyTorch tutorial':<54} {v:6.1f}x {'MET' if v >= 3.5 else 'NOT MET'}")


if __name__ == "__main__":
    main()
