#!/usr/bin/env bash
# bench/batching.sh - batched training Forwards and Backwards
# (server.batch_wait_ms, server.batch_backward; issue 22 item 4): the same
# trainers against psd four ways - batching off, Forwards only, Forwards
# and Backwards, and Forwards and Backwards in groups of at most SMALL_MAX
# samples (default 64: two callers' batches of 32) - each bench/trainers.sh
# with psd started with
# server.threads raised so that every trainer's call can be held at once (a
# held call keeps its handler thread). The modes alternate REPEAT times (off,
# fwd, fwd+bwd, off, ...) so that load drifting during the run hits all of
# them (off, fwd, both, small, off, ...); the summary prints per mode the
# median samples/s and psd's CPU per
# sample (utime + stime over the samples, which other load disturbs less)
# and each against batching off; first bench_group, the same combined
# against alone in psd's compute only. For information on CPU (one bigger
# computation is not cheaper per sample there; the target is a GPU's
# launches); the same script on a lent GPU with model.placement on cuda:0 is
# the GPU figure.
#
#   bench/batching.sh                          8 trainers, 3 rounds a mode, twice
#   TRAINERS="4 8" WAIT_MS=2 REPEAT=1 bench/batching.sh
#   EXECUTORS=4 SMALL_MAX=64 bench/batching.sh   (server.batch_executors, the small groups' size)
#   PLACE="--set model.placement.conv=cuda:0 --set model.placement.fc=cuda:0" bench/batching.sh
# With PLACE on a GPU (cuda:N) the summary ends with issue 22's target - 8
# trainers with Forwards and Backwards batched (the better of the two group
# sizes) >= 4x the same trainers with batching off - and, where nvidia-smi
# is there, the GPU's mean utilisation
# per mode (sampled every 100 ms while each mode's trainers ran).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh   # PY
BUILD=${BUILD:-build}
OUT=${OUT:-$BUILD/bench-results/batching-$(date +%Y%m%d-%H%M%S)}
export TRAINERS=${TRAINERS:-8} RUNS=${RUNS:-3} BUILD
WAIT_MS=${WAIT_MS:-2}
SMALL_MAX=${SMALL_MAX:-64}
EXECUTORS=${EXECUTORS:-1}   # server.batch_executors of the batched modes
REPEAT=${REPEAT:-2}
max=0
for n in $TRAINERS; do [ "$n" -gt "$max" ] && max=$n; done
threads=$(( max + 2 )); [ "$threads" -gt 64 ] && threads=64
mkdir -p "$OUT"
echo "== batched training calls off / Forwards / Forwards+Backwards / the same in groups <= $SMALL_MAX samples ($TRAINERS trainers, server.batch_wait_ms=$WAIT_MS," \
     "server.threads=$threads, $REPEAT x alternately; load $(cut -d' ' -f1-3 /proc/loadavg))"
# psd's compute alone (no RPC, no waiting): 8 parts of 32 alone vs combined, in one process; then the
# same with glibc told to keep freed memory (a combined call's working set, ~8 x a batch-32 step's, is
# more than the dnnl backend's buffer pool keeps, 64 MB, so its big buffers are fresh mmaps whose pages
# fault in on every call)
keep="MALLOC_MMAP_THRESHOLD_=1000000000 MALLOC_TRIM_THRESHOLD_=1000000000"
gplace=$(grep -o 'cuda:[0-9]*' <<<"${PLACE:-}" | head -n 1 || true)   # on a GPU: the same on it, wall time too
"$BUILD/bench/bench_group" --parts 8 --batch 32 --reps "${GROUP_REPS:-5}" ${gplace:+--place $gplace} 2>/dev/null |
  tee "$OUT/group.txt"
if [ -z "$gplace" ]; then
  echo "  the same with $keep:"
  env $keep "$BUILD/bench/bench_group" --parts 8 --batch 32 --reps "${GROUP_REPS:-5}" 2>/dev/null | tail -n 3 |
    tee -a "$OUT/group.txt"
fi
for rep in $(seq 1 "$REPEAT"); do
  for mode in off fwd both small; do
    case $mode in
      off)  args="--set server.batch_wait_ms=0" ;;
      fwd)  args="--set server.batch_wait_ms=$WAIT_MS --set server.batch_backward=false" ;;
      both) args="--set server.batch_wait_ms=$WAIT_MS --set server.batch_backward=true" ;;
      small) args="--set server.batch_wait_ms=$WAIT_MS --set server.batch_backward=true --set server.batch_max_samples=$SMALL_MAX" ;;
    esac
    case $mode in
      off) ;;
      *) args="$args --set server.batch_executors=$EXECUTORS" ;;
    esac
    echo "-- $mode (round $rep): $args"
    smi=
    if [[ "${PLACE:-}" == *cuda:* ]] && command -v nvidia-smi >/dev/null 2>&1; then
      mkdir -p "$OUT/$mode-$rep"
      nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 100 >"$OUT/$mode-$rep/gpu-util.txt" 2>/dev/null &
      smi=$!
    fi
    OUT="$OUT/$mode-$rep" PSD_ARGS="--set server.threads=$threads $args ${PLACE:-}" bench/trainers.sh
    [ -z "$smi" ] || { kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null || true; }
  done
done
gpu=0; [[ "${PLACE:-}" == *cuda:* ]] && gpu=1
$PY - "$OUT" "$TRAINERS" "$REPEAT" "$gpu" "$SMALL_MAX" <<'PYEOF' | tee "$OUT/batching.txt"
import glob, os, re, statistics, sys
out, counts, rep, gpu = sys.argv[1], [int(x) for x in sys.argv[2].split()], int(sys.argv[3]), sys.argv[4] == "1"
names = {"off": "batching off", "fwd": "Forwards batched", "both": "Forwards+Backwards batched",
         "small": f"... groups <= {sys.argv[5]} samples"}
res, comb = {}, {}
for mode in names:
    for r in range(1, rep + 1):
        p = os.path.join(out, f"{mode}-{r}", "trainers.txt")
        if not os.path.exists(p):
            continue
        for line in open(p):
            f = line.split()
            if len(f) > 3 and f[0].isdigit():
                res.setdefault((mode, int(f[0])), []).append((float(f[1]), float(f[2])))
        for n in counts:   # psd's batching counters at the end of its last round
            snaps = sorted(glob.glob(os.path.join(out, f"{mode}-{r}", "trainers", f"n{n}-r*-snap1.txt")))
            if not snaps:
                continue
            c = {}
            for line in open(snaps[-1]):
                m = re.match(r'psd_batched_(\w+)_total\{ran="(\w+)"\} (\S+)', line)
                if m:
                    c[(m.group(1), m.group(2))] = float(m.group(3))
            comb.setdefault((mode, n), []).append(c)
print("batched training calls, psd + N bench_trainer (MNIST batch 32, Forward + Backward + Step); medians over")
print("the alternated repeats of each mode's median round; x off: the same figure over batching off's")
print(f"{'trainers':>8} {'mode':<28} {'samples/s':>10} {'x off':>6} {'psd CPU us/sample':>18} {'x off':>6}"
      f"  {'combined: Forwards':>18} {'Backwards':>10}" + (f" {'GPU util %':>10}" if gpu else ""))
def util(mode):   # the GPU's mean utilisation over the samples taken while this mode's trainers ran
    v = []
    for r in range(1, rep + 1):
        p = os.path.join(out, f"{mode}-{r}", "gpu-util.txt")
        if os.path.exists(p):
            v += [float(x) for x in open(p).read().split() if x.replace(".", "", 1).isdigit()]
    return f"{statistics.mean(v):.0f}" if v else "-"
rates = {}
for n in counts:
    base = res.get(("off", n))
    for mode, name in names.items():
        v = res.get((mode, n))
        if not v:
            continue
        sps, cpu = statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)
        rs = rc = ""
        if base:
            rs = f"{sps / statistics.median(x[0] for x in base):.2f}"
            rc = f"{cpu / statistics.median(x[1] for x in base):.2f}"
        share = []
        for kind in ("forwards", "backwards"):   # of the held calls, over every repeat
            h = sum(c.get((kind, "held"), 0) for c in comb.get((mode, n), []))
            k = sum(c.get((kind, "combined"), 0) for c in comb.get((mode, n), []))
            share.append(f"{100 * k / h:.0f} %" if h else "-")
        rates[(mode, n)] = sps
        print(f"{n:>8} {name:<28} {sps:>10.0f} {rs:>6} {cpu:>18.1f} {rc:>6}  {share[0]:>18} {share[1]:>10}"
              + (f" {util(mode):>10}" if gpu else ""))
if gpu:   # issue 22 item 4, on a GPU: 8 trainers batched >= 4x the same 8 trainers with batching off
    best = max((m for m in ("both", "small") if (m, 8) in rates), key=lambda m: rates[(m, 8)], default=None)
    if ("off", 8) in rates and best:
        g = rates[(best, 8)] / rates[("off", 8)]
        print(f"target: on the GPU, 8 trainers with Forwards and Backwards batched ({names[best]}, the better) >= 4x"
              f" batching off: {g:.2f}x  {'MET' if g >= 4 else 'NOT MET'}")
    else:
        print("target: on the GPU, 8 trainers batched >= 4x batching off: not measured (needs TRAINERS with 8)")
PYEOF
