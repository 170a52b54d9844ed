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
PHASES = ("recv", "queue", "decode", "ctx", "lock", "compute", "handler", "encode", "send", "held")
# mnist_cnn's multiply-adds per sample (forward): conv1 1->32 3x3 on 26x26
# outputs, conv2 32->64 3x3 on 24x24, fc1 9216->128, fc2 128->10; a training
# sample counts forward + backward = 3x the forward, 2 FLOPs per multiply-add
MNIST_TRAIN_FLOP = 3 * 2 * (32 * 26 * 26 * 9 + 64 * 24 * 24 * 32 * 9 + 9216 * 128 + 128 * 10)


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


def rep_rates(dd, n):
    """One e2e run directory of n trainers: {repetition number: the combined
    samples/s of its trainers while all n ran}, for the repetitions where all
    n reported. The window is from the last trainer's start to the first
    one's end; each trainer counts its timed batches that ended in it
    (bench_trainer stamps every batch's end). The trainers start together,
    but they do not end together: one that got more of psd's time finishes
    its batches first, and the other then runs alone, one psd worker busy
    and the other CPU idle (up to 15 % of a 60-batch run) - what one trainer
    does, not n. Result files without stamps (older runs): samples over the
    span from the first start to the last end."""
    runs = {}
    for f in glob.glob(os.path.join(dd, "rep*-t*.txt")):
        rep = int(os.path.basename(f).split("-")[0][3:])
        ends, k = [], None
        for line in read(f):
            if line.startswith("batch "):
                parts = line.split()
                if len(parts) > 2:
                    ends.append(float(parts[2]))
            elif line.startswith("trainer "):
                k = kv(line)
        if k:
            runs.setdefault(rep, []).append((int(k["samples"]), int(k["batches"]), float(k["t_start"]),
                                             float(k["t_end"]), ends))
    out = {}
    for rep, tr in runs.items():
        if len(tr) != n:
            continue
        t0, t1 = max(t[2] for t in tr), min(t[3] for t in tr)
        if all(t[4] for t in tr) and t1 > t0:
            done = sum(t[0] // t[1] * sum(1 for e in t[4] if t0 < e <= t1) for t in tr)
            out[rep] = done / (t1 - t0)
        else:
            out[rep] = sum(t[0] for t in tr) / (max(t[3] for t in tr) - min(t[2] for t in tr))
    return out


def read_e2e(dd, n):
    """One e2e run directory of n trainers: the combined samples/s of each
    repetition where all n trainers reported (rep_rates, in order), the RPC
    and probe latencies (ms) and the wall seconds per batch."""
    rpcs, probes, walls = {}, {}, []
    for f in sorted(glob.glob(os.path.join(dd, "rep*-t*.txt"))):
        for line in read(f):
            if line.startswith("trainer "):
                k = kv(line)
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
    rates = [r for _, r in sorted(rep_rates(dd, n).items())]
    return rates, rpcs, probes, walls


def fma_peaks(d):
    """Per-core FP32 FMA peak (GFLOP/s) by oneDNN ISA name, from fma.txt."""
    peaks = {}
    for line in read(os.path.join(d, "fma.txt")):
        m = re.match(r"fma_peak: isa (\S+) .* per core ([0-9.]+) GFLOP/s", line)
        if m:
            peaks[m.group(1)] = float(m.group(2))
    return peaks


def fma_cpus(d):
    """The CPUs fma_peak counted (its "per core x N CPUs"), or None."""
    for line in read(os.path.join(d, "fma.txt")):
        m = re.search(r"per core x (\d+) CPUs", line)
        if m:
            return int(m.group(1))
    return None


def lm_table(d):
    """Section 8: the language model's fused mode, psd + 2 trainers, per ISA
    (lm.txt), as a share of that ISA's FMA peak (per core x the CPUs)."""
    rows = [kv(line) for line in read(os.path.join(d, "lm.txt")) if line.startswith("lm ")]
    if not rows:
        return
    peaks, ncpu = fma_peaks(d), fma_cpus(d)
    print()
    print("8. Language model (rnn_lm, configs/rnn_lm.yaml), fused decoder, psd + 2 ps-train lm trainers; FLOPs per")
    print(f"   token {int(rows[0]['flop_per_token']):,} (forward + backward of the trainers' 2-layer LSTM and psd's"
          f" decoder, as bench/lm.sh counts); peak = one core's FMA rate x {ncpu} CPUs (fma_peak, same ISA)")
    print("   CPU us/token: psd's (while the trainers ran) + the trainers' (their loops), which load disturbs less;")
    print("   Step lock: psd's wait for the weights locks per Step (phase counters)")
    print(f"   {'ISA':<28} {'tokens/s':>9} {'GFLOP/s':>8} {'peak GFLOP/s':>13} {'% of peak':>10}   target (issue 22)"
          f"   CPU us/token psd + trainers   Step lock")
    for k in rows:
        tps, flop = float(k["tokens_s"]), float(k["flop_per_token"])
        isa, peak = k["isa"], peaks.get(k["isa"])
        g = tps * flop / 1e9
        name = f"{isa} ({'host' if k['label'] == 'host' else 'emul.'})"
        if peak and ncpu:
            share = 100 * g / (peak * ncpu)
            met = 'MET' if share >= 50 else 'NOT MET'
            print(f"   {name:<28} {tps:>9.0f} {g:>8.2f} {peak * ncpu:>13.1f} {share:>9.1f}%   >= 50%: {met:<7}"
                  f"   {k.get('psd_us_tok', '?')} + {k.get('trainer_us_tok', '?')}"
                  f"{'':>17}{k.get('step_lock_ms', '?')} ms")
        else:
            print(f"   {name:<28} {tps:>9.0f} {g:>8.2f} {'?':>13} {'?':>10}   (no FMA peak measured for {isa})")


def snap(path):
    """A psd_snap file: its psd_stat fields and the phase counters."""
    st, ph, calls, samples = {}, {}, {}, 0.0
    for line in read(path):
        if line.startswith("psd_stat "):
            st = {k: float(v) for k, v in kv(line).items()}
            continue
        m = re.match(r'psd_call_phase_seconds_total\{method="(\w+)",phase="(\w+)"\} (\S+)', line)
        if m:
            ph.setdefault(m.group(1), {})[m.group(2)] = float(m.group(3))
            continue
        m = re.match(r'psd_call_phase_calls_total\{method="(\w+)"\} (\S+)', line)
        if m:
            calls[m.group(1)] = float(m.group(2))
            continue
        m = re.match(r"psd_samples_total (\S+)", line)
        if m:
            samples = float(m.group(1))
            continue
        m = re.match(r"psd_worker_poll_seconds_total (\S+)", line)
        if m:
            st["poll_s"] = float(m.group(1))
    return st, ph, calls, samples


def snap_delta(dd):
    """psd's cost between snap0 and snap1 of an e2e run: stat deltas, samples,
    and per method {phase: mean seconds per call} with the call count."""
    a, b = snap(os.path.join(dd, "snap0.txt")), snap(os.path.join(dd, "snap1.txt"))
    if not a[0] or not b[0]:
        return None
    st = {k: b[0][k] - a[0].get(k, 0) for k in b[0]}
    per = {}
    for meth, p in b[1].items():
        n = b[2].get(meth, 0) - a[2].get(meth, 0)
        if n > 0:
            per[meth] = ({k: (v - a[1].get(meth, {}).get(k, 0)) / n for k, v in p.items()}, n)
    return st, b[3] - a[3], per


def client_means(dd):
    """Per trainer-batch means over every batch (warm-up ones included, as
    psd's counters include their calls) of every trainer and run: wall W
    and, per RPC, total / call / client serialisation (s)."""
    walls, rpcs = [], {}
    for f in sorted(glob.glob(os.path.join(dd, "rep*-t*.txt"))):
        for line in read(f):
            if line.startswith("batch "):
                walls.append(float(line.split()[1]) / 1e6)
            elif line.startswith("rpc ") or line.startswith("wrpc "):
                _, name, tot, call, ser = line.split()
                r = rpcs.setdefault(name, [[], [], []])
                for i, v in enumerate((tot, call, ser)):
                    r[i].append(float(v) / 1e6)
    if not walls:
        return None
    return statistics.mean(walls), {k: tuple(statistics.mean(x) for x in v) for k, v in rpcs.items()}


def trainer_cpu_budget(dd, n, psd_us, step_us):
    """The trainers' CPU per sample (bench_trainer's cpu_s: user + system of
    the whole process, gRPC's threads included, over the timed batches) and
    the end-to-end ratio split into CPU work and CPUs kept busy:
    e2e / (2 x step) = (step's CPU / psd's + trainers' CPU per sample) x
    (CPUs busy with them / 2)."""
    cpu, smp = 0.0, 0
    for f in sorted(glob.glob(os.path.join(dd, "rep*-t*.txt"))):
        for line in read(f):
            if line.startswith("trainer "):
                k = kv(line)
                if "cpu_s" in k:
                    cpu += float(k["cpu_s"])
                    smp += int(k["samples"])
    rates = read_e2e(dd, n)[0]
    if smp <= 0 or not rates:
        return
    tr_us = cpu / smp * 1e6
    tot = psd_us + tr_us
    busy = tot * 1e-6 * statistics.median(rates)
    print(f"   the trainers' CPU per sample {tr_us:.1f} us (processes, gRPC's threads included); psd + trainers"
          f" {tot:.1f} us; CPUs busy with them {busy:.2f}")
    if step_us:
        print(f"   e2e / (2 x 1-thread step) ~= step's CPU / (psd + trainers) x CPUs busy / 2 = {step_us / tot:.2f} x"
              f" {busy / 2:.2f} = {step_us / tot * busy / 2:.2f}")


def phase_table(d, label, n, comp, bs=32):
    """Section 2b: one trainer's batch and one sample of psd + n trainers,
    phase by phase, from the client's timings and psd's phase counters."""
    dd = os.path.join(d, f"e2e-{label}-{n}")
    cm, sd = client_means(dd), snap_delta(dd)
    if not cm or not sd or not sd[2]:
        return None
    wall, rpcs = cm
    st, samples, per = sd
    server_of = {"Forward": "Forward", "Backward": "Backward", "Backward+Step": "Backward", "Step": "Step"}
    names = [k for k in ("Forward", "Backward", "Backward+Step", "Step") if k in rpcs and server_of[k] in per]
    rows = []   # (name, ms per batch by rpc or None, total ms)
    local = wall - sum(rpcs[k][0] for k in rpcs)
    ser = {k: rpcs[k][2] for k in names}
    rest = {k: rpcs[k][1] - per[server_of[k]][0].get("span", 0) for k in names}
    rows.append(("trainer: batch, loss gradient", None, local))
    rows.append(("trainer: encode + decode", ser, sum(ser.values())))
    for p in PHASES:
        v = {k: per[server_of[k]][0].get(p, 0) for k in names}
        if p == "held" and not any(v.values()):
            continue
        rows.append((f"psd: {p}", v, sum(v.values())))
    rpcl = {k: per[server_of[k]][0].get("span", 0) - sum(per[server_of[k]][0].get(p, 0) for p in PHASES
                                                        if p != "held") for k in names}
    rows.append(("psd: rpc layer (span - phases)", rpcl, sum(rpcl.values())))
    rows.append(("transport + scheduler (rest)", rest, sum(rest.values())))
    print()
    print(f"2b. Where the time goes: psd + {n} trainers ({label}), one trainer's batch of {bs} and one sample")
    print("    (means over every batch, warm-up included; psd's phases from its /metrics counters (server.profile); rest = the")
    print("    client's call time less psd's span from accepting the call to handing gRPC the reply: loopback,")
    print("    gRPC's threads and waiting for a CPU; a sample's share = batch ms / (batch x trainers))")
    hdr = "".join(f"{k:>15}" for k in names)
    print(f"   {'phase':<33}{hdr}{'ms/batch':>10}{'us/sample':>10}{'share':>7}")
    for name, by, tot in rows:
        cells = "".join(f"{(by[k] * 1e3 if by else 0):>15.3f}" if by else f"{'':>15}" for k in names)
        print(f"   {name:<33}{cells}{tot * 1e3:>10.3f}{tot * 1e6 / (bs * n):>10.1f}{100 * tot / wall:>6.1f}%")
    print(f"   {'wall (one trainer, per batch)':<33}{'':>{15 * len(names)}}{wall * 1e3:>10.3f}"
          f"{wall * 1e6 / (bs * n):>10.1f}{100.0:>6.1f}%")
    # psd's send phase ends when handing gRPC the reply returns; gRPC writes
    # it from psd's thread, which on a loaded machine can lose its CPU after
    # the write, while the trainer already has the reply: a method's rest is
    # then negative. It is not credited to the measured share.
    measured = 1 - sum(max(v, 0.0) for v in rest.values()) / wall
    print(f"   phases measured directly: {100 * measured:.1f}% of the wall time (target >= 90%: "
          f"{'MET' if measured >= 0.9 else 'NOT MET'})")
    neg = [k for k in names if rest[k] < 0]
    if neg:
        print(f"   (negative rest for {', '.join(neg)}: psd's thread returned from the write after"
              " the trainer had the reply; counted as 0 in the share above)")
    comp_ms = sum(per[server_of[k]][0].get("compute", 0) for k in names) * 1e3
    if samples > 0:
        cpu_us = st.get("cpu_s", 0) / samples * 1e6
        ref = comp.get(("dnnl", 1, "step"))
        line = f"   psd's CPU per sample {cpu_us:.1f} us"
        if st.get("poll_s"):
            line += f" (of which idle workers polling for their next call: {st['poll_s'] * 1e6 / samples:.1f} us)"
        if ref and len(ref) > 3 and ref[3]:
            line += f"; the in-process 1-thread step's {ref[3]:.1f} us (ratio {ref[3] / cpu_us:.2f})"
        print(line)
        print(f"   per batch in psd: compute {comp_ms:.2f} ms, {st.get('minflt', 0) * bs / samples:.0f} page faults,"
              f" {st.get('ctxsw', 0) * bs / samples:.0f} context switches, its threads waited"
              f" {st.get('runq_s', 0) * bs / samples * 1e3:.2f} ms for a CPU (load from anything else shows here)")
        trainer_cpu_budget(dd, n, cpu_us, ref[3] if ref and len(ref) > 3 else None)
    return measured


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
    comp, phases, last, isa_of, conc, par = {}, {}, None, {}, {}, {}
    for line in read(os.path.join(d, "compute.txt")):
        if line.startswith("compute "):
            k = kv(line)
            if "concurrent" in k:   # two 1-thread processes at once: their sum
                conc.setdefault(k["what"], []).append(float(k["median"]))
                last = None
                continue
            if "parallel" in k:     # two 1-thread steps at once in one process, one model
                par[k["what"]] = float(k["median"])
                last = None
                continue
            last = (k["backend"], int(k["threads"]), k["what"])
            isa_of[k["backend"]] = k.get("isa", "?")
            comp[last] = (float(k["median"]), float(k["min"]), float(k["max"]), float(k.get("cpu_us", 0)))
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
          " plain-layout = split with PS_DNNL_LAYOUT=plain;")
    print("   ct1 = split with server.compute_threads=1 (every call on one thread); one = one call a batch, Forward with")
    print("   the batch's class ids and step=true (ps-train's default); local = one over psd's local transport")
    print("   (server.local_socket: a unix socket and shared memory); isa@X, one@X: split, one at an emulated ISA")
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

    measured = phase_table(d, "split", 2, comp)
    phase_table(d, "fused", 2, comp)

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

    print()
    print("   Issue 22 (close to the hardware; same run, host ISA)")
    peaks = fma_peaks(d)
    one = comp.get(("dnnl", 1, "step"))
    isa = isa_of.get("dnnl", "?")
    peak = peaks.get(isa)
    if one and ("split", 2) in e2e:
        v, ideal = e2e[("split", 2)], 2 * one[0]
        print(f"   psd + 2 trainers, three calls a batch (--split-calls) >= 0.85 x (2 x the in-process 1-thread step): "
              f"{v:.0f} / {ideal:.0f} = {v / ideal:.2f}  {verdict(v / ideal >= 0.85)}")
        paired_line("  the same, each repetition against 2 x the step measured beside it",
                    os.path.join(d, "e2e-split-2"))
        if "step" in conc and len(conc["step"]) == 2:
            c2 = sum(conc["step"])
            print(f"     for information: two 1-thread steps run at once in two processes: {c2:.0f} samples/s"
                  f" ({c2 / ideal:.2f} of 2 x one alone); psd + 2 trainers = {v / c2:.2f} x that")
        if "step" in par:
            p2 = par["step"]
            one_e = e2e.get(("one", 2))
            print(f"     for information: two 1-thread steps at once in one process on one model (psd's hogwild and"
                  f" weight snapshots, no RPC): {p2:.0f} samples/s ({p2 / ideal:.2f} of 2 x one alone); psd + 2"
                  f" trainers = {v / p2:.2f} x that" + (f", one call a batch {one_e / p2:.2f} x" if one_e else ""))
        if ("fused", 2) in e2e:
            f = e2e[("fused", 2)]
            print(f"     fused step (Backward with step=true): {f:.0f} = {f / ideal:.2f} x (2 x the 1-thread step)")
        def one_call_target(label, what):
            if (label, 2) in e2e:
                f = e2e[(label, 2)]
                print(f"   {what} >= 0.85 x (2 x the step): {f:.0f} / {ideal:.0f} = {f / ideal:.2f}  "
                      f"{verdict(f / ideal >= 0.85)}")
                paired_line("  the same, each repetition against 2 x the step measured beside it",
                            os.path.join(d, f"e2e-{label}-2"))
        one_call_target("one", "one call a batch (ps-train's default), psd + 2 trainers")
        if ("ct1", 2) in e2e:
            f = e2e[("ct1", 2)]
            print(f"     one compute thread per call (server.compute_threads=1): {f:.0f} = {f / ideal:.2f} x"
                  f" (2 x the 1-thread step), {f / v:.2f} x psd's default")
        one_call_target("local", "one call a batch over psd's local transport (server.local_socket; trainers on psd's host)")
        if peak:
            print(f"     % of the FMA peak ({isa}, {peak:.1f} GFLOP/s per core; {MNIST_TRAIN_FLOP / 1e6:.1f} MFLOP per"
                  f" training sample): in-process 1 thread {100 * one[0] * MNIST_TRAIN_FLOP / 1e9 / peak:.1f}% of one"
                  f" core; psd + 2 trainers {100 * v * MNIST_TRAIN_FLOP / 1e9 / (2 * peak):.1f}% of two")
    if measured is not None:
        print(f"   phases measured directly >= 90% of the wall time (2b, 2 trainers): {100 * measured:.1f}%  "
              f"{verdict(measured >= 0.9)}")

    per_isa(d, comp, phases, isa_of, e2e, torch, torch_isa, torch_caps)
    resnet(os.path.join(d, "resnet"))
    lm_table(d)


def paired(dd, n=2):
    """The e2e run in dd against the 1-thread in-process step measured right
    before and after each repetition (bench/run.sh PAIR_STEP): each
    repetition's samples/s over 2 x the mean of its two adjacent steps.
    Returns (median ratio, [ratios]) or (None, [])."""
    steps = []
    for k in range(0, 10):
        lines = [l for l in read(os.path.join(dd, f"pair{k}.txt"))
                 if l.startswith("compute ") and kv(l).get("what") == "step"]
        if not lines:
            break
        steps.append(float(kv(lines[0])["median"]))
    out = [rate / (steps[rep - 1] + steps[rep]) for rep, rate in sorted(rep_rates(dd, n).items())
           if rep < len(steps)]   # over 2 x the mean of its two adjacent steps
    return (statistics.median(out), out) if out else (None, [])


def isa_target(isa, what, v, goal=0.85, width=54):
    """One target line of a per-ISA table: the ISA, what, the figure, its verdict."""
    print(f"   {isa:<18} {what:<{width}} {v:6.2f}  {'MET' if v >= goal else 'NOT MET'}")


def paired_line(what, dd, goal=0.85, width=54, isa=None):
    """A target line for paired(dd), when the run measured adjacent steps."""
    v, each = paired(dd)
    if v is None:
        return
    lab = f"{what} (adjacent steps; {len(each)} reps: {' / '.join(f'{x:.2f}' for x in each)})"
    if isa is None:
        print(f"   {lab}: {v:.2f}  {'MET' if v >= goal else 'NOT MET'}")
    else:
        isa_target(isa, lab, v, goal, width)


def resnet(d):
    """Section 7: the small ResNet model file (bench/run.sh section 4b), per ISA."""
    comp, phases, isa_of, order, last, batch, par = {}, {}, {}, [], None, "?", {}
    for line in read(os.path.join(d, "compute.txt")):
        if line.startswith("compute "):
            k = kv(line)
            col = k["backend"].split("@", 1)[1] if "@" in k["backend"] else "host"
            if "parallel" in k:
                if k["what"] == "step":
                    par[col] = float(k["median"])
                last = None
                continue
            if col not in order:
                order.append(col)
            isa_of[col] = k.get("isa", "?")
            last = (col, int(k["threads"]), k["what"])
            comp[last] = float(k["median"])
            batch = k.get("batch", batch)
        elif "phases" in line and last:
            phases[last] = {a: float(b) for a, b in re.findall(r"(forward|backward|step) ([0-9.]+)", line)}
    if not order:
        return
    e2e, e2e_one, e2e_local = {}, {}, {}
    for col in order:
        for into, lab in ((e2e, col), (e2e_one, f"one@{col}"), (e2e_local, f"local@{col}")):
            rates = read_e2e(os.path.join(d, f"e2e-{lab}-2"), 2)[0]
            if rates:
                into[col] = statistics.median(rates)
    print()
    print("7. The small ResNet (examples/models/small_resnet.yaml: conv, BatchNorm, residual Adds, pooling, linear)")
    print(f"   on the MNIST images, batch {batch}, samples/s; psd serving it to 2 bench_trainer processes (bench/run.sh 4b)")
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
    eo = [e2e_one.get(c) for c in order]
    row("psd + 2 trainers, one call a batch (fit's default)", eo)
    row("  / (2 x in-process step, 1 thread)", [ratio(a, 2 * b) if b else None for a, b in zip(eo, st1)], "{:.2f}")
    el = [e2e_local.get(c) for c in order]
    if any(el):
        row("... over psd's local transport (server.local_socket)", el)
        row("  / (2 x in-process step, 1 thread)", [ratio(a, 2 * b) if b else None for a, b in zip(el, st1)], "{:.2f}")
    pa = [par.get(c) for c in order]
    if any(pa):   # the ceiling without the RPC (bench_compute --parallel 2 --snapshots)
        row("2 x 1-thread step in one process, one model", pa)
        row("  / (2 x in-process step, 1 thread)", [ratio(a, 2 * b) if b else None for a, b in zip(pa, st1)], "{:.2f}")
        row("  psd one call a batch / that", [ratio(a, b) for a, b in zip(eo, pa)], "{:.2f}")
        if any(el):
            row("  ... over the local transport / that", [ratio(a, b) for a, b in zip(el, pa)], "{:.2f}")
    row("psd start-up: reference kernels logged",
        [fallbacks_logged(d, c) for c in order], "{:d}")
    print()
    print("   Targets (issue 18)")
    for i, c in enumerate(order):
        vs = ratio(e[i], 2 * st1[i]) if st1[i] else None
        for what, v, goal in (("step/forward 1 thread >= 0.30", res[c].get("sf1"), 0.30),
                              ("step/forward 2 threads >= 0.30", res[c].get("sf2"), 0.30),
                              ("3 calls >= 0.85 x (2 x 1-thread step)", vs, 0.85)):
            if v is not None:
                isa_target(isa_of[c], what, v, goal)
        paired_line("  the same", os.path.join(d, f"e2e-{c}-2"), isa=isa_of[c])
        vo = ratio(eo[i], 2 * st1[i]) if st1[i] else None
        if vo is not None:
            isa_target(isa_of[c], "one call a batch (fit's default): the same ratio", vo)
            paired_line("  the same", os.path.join(d, f"e2e-one@{c}-2"), isa=isa_of[c])
        vl = ratio(el[i], 2 * st1[i]) if st1[i] else None
        if vl is not None:
            isa_target(isa_of[c], "... over the local transport (trainers on psd's host)", vl)
            paired_line("  the same", os.path.join(d, f"e2e-local@{c}-2"), isa=isa_of[c])


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
    st1 = [med((be, 1, "step")) for _, be, _, _ in cols]
    row("psd + 2 trainers, total", e)
    row("  / in-process step, 2 threads (target >= 0.85)", [ratio(a, b) for a, b in zip(e, st2)], "{:.2f}")
    row("  / (2 x in-process step, 1 thread) (>= 0.85)", [ratio(a, 2 * b) if b else None for a, b in zip(e, st1)],
        "{:.2f}")
    peaks = fma_peaks(d)
    row("  % of the FMA peak of 2 cores at that ISA",
        [f"{100 * a * MNIST_TRAIN_FLOP / 1e9 / (2 * peaks[isa_of.get(be)]):.1f}%"
         if a and peaks.get(isa_of.get(be)) else None for a, (_, be, _, _) in zip(e, cols)])
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
        v22 = ratio(e[i], 2 * st1[i]) if st1[i] else None
        for what, v, goal in ((f"step/forward 1 thread >= 0.30", r1, 0.30), (f"step/forward 2 threads >= 0.30", r2, 0.30),
                              ("psd + 2 trainers >= 0.85 x in-process 2-thread step", vs, 0.85),
                              ("issue 22: 3 calls >= 0.85 x (2 x 1-thread step)", v22, 0.85)):
            if v is not None:
                isa_target(isa, what, v, goal)
        paired_line("  issue 22, the same", os.path.join(d, "e2e-" + "-".join(map(str, key))), isa=isa)
        okey = ("one", 2) if name == "host" else (f"one@{name}", 2)
        if okey in e2e and st1[i]:
            isa_target(isa, "issue 22, one call a batch (ps-train's default)", e2e[okey] / (2 * st1[i]))
            paired_line("  the same", os.path.join(d, "e2e-" + "-".join(map(str, okey))), isa=isa)
        if isa.startswith("avx2") and ratio(e[i], best[i]) is not None:
            v = ratio(e[i], best[i])
            print(f"   {isa:<18} {'psd + 2 trainers >= 3.5 x PyTorch tutorial':<54} {v:6.1f}x {'MET' if v >= 3.5 else 'NOT MET'}")


if __name__ == "__main__":
    main()
