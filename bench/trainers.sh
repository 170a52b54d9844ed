#!/usr/bin/env bash
# bench/trainers.sh - psd's cost per sample as trainers grow (issue 22): one
# psd (configs/local.yaml, MNIST) against 1, 2, 4, 8 and 16 bench_trainer
# processes on loopback, RUNS timed rounds each after a warm-up round.
# Prints, per trainer count, the total samples/s, psd's CPU-seconds per
# sample (its utime + stime between two snapshots over the samples it
# received, median of the rounds: what psd's own work costs, which other
# jobs on the machine change far less than they change samples/s), page
# faults, context switches and run-queue wait per batch, and the p50/p99
# latency of Forward, Backward and Step as the trainers saw them, and the
# trainers' own CPU per sample (bench_trainer's cpu_s).
# Target: psd's CPU per sample at 16 trainers <= 1.10 x at 2.
#
#   bench/trainers.sh                 1 2 4 8 16 trainers, 3 rounds each
#   TRAINERS="2 16" RUNS=3 bench/trainers.sh
#   QUICK=1 bench/trainers.sh         fewer batches (a smoke run)
#   PSD_ARGS="--set server.batch_wait_ms=2" bench/trainers.sh   more psd flags (bench/batching.sh)
# Raw results: $OUT/trainers/ (OUT default build/bench-results/trainers-<date>);
# the table is also saved as $OUT/trainers.txt. make bench runs it with OUT
# set to its own results directory; make bench-trainers runs it alone.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DATA=${DATA:-data/mnist}
OUT=${OUT:-$BUILD/bench-results/trainers-$(date +%Y%m%d-%H%M%S)}
TRAINERS=${TRAINERS:-1 2 4 8 16}
RUNS=${RUNS:-3}
. bench/lib.sh   # PY: Debian's python3 where it is
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
# batches per trainer in a round: about the same total work at every count
# (ROUND_BATCHES: the batches of all trainers together in a round; more on a fast GPU)
if [ -n "${QUICK:-}" ]; then WORK=${ROUND_BATCHES:-48}; MINB=4; else WORK=${ROUND_BATCHES:-192}; MINB=8; fi
dir="$OUT/trainers"
mkdir -p "$dir"
echo "== psd's cost per sample as trainers grow ($TRAINERS trainers; $RUNS rounds each; load $(cut -d' ' -f1-3 /proc/loadavg))"
for n in $TRAINERS; do
  b=$(( WORK / n )); [ "$b" -lt "$MINB" ] && b=$MINB
  port=$(bench_port)
  addr="127.0.0.1:$port" maddr="127.0.0.1:$((port + 1))"
  # per-client limits for n connections from this one host: every trainer
  # holds one call at a time. What is measured is psd's cost, not the
  # model's accuracy: a smaller learning rate keeps 16 asynchronous
  # trainers' stale gradients from blowing the weights up (at lr 0.03, 8
  # of them reached non-finite gradients within ~100 steps, and psd
  # refuses those by default), and a step that still got one is skipped
  # rather than failing the trainer and the bench. Idle workers do not poll
  # for their next call (server.idle_poll_us=0): that CPU is spent while a
  # worker has nothing to do, more with few trainers than with many, and
  # would make the cost of serving a sample look flatter than it is.
  "$BUILD/bin/psd" --config configs/local.yaml --listen "$addr" --metrics-listen "$maddr" \
    --set server.max_calls_per_client=$(( 4 * n + 16 )) --set optimizer.lr=0.003 \
    --set server.nonfinite_policy=skip --set server.idle_poll_us=0 ${PSD_ARGS:-} 2>"$dir/psd-$n.log" &
  psd=$!
  wait_psd "$maddr" || true
  round() {  # tag batches
    local pids=() r
    for r in $(seq 1 "$n"); do
      "$BUILD/bench/bench_trainer" --server "$addr" --rank "$r" --batches "$2" --warmup 0 --data "$DATA" \
        --out "$dir/n$n-$1-t$r.txt" >/dev/null &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
  }
  round warm 2
  for k in $(seq 1 "$RUNS"); do
    psd_snap "$psd" "$maddr" "$dir/n$n-r$k-snap0.txt"
    round "r$k" "$b"
    psd_snap "$psd" "$maddr" "$dir/n$n-r$k-snap1.txt"
  done
  kill -TERM "$psd"; wait "$psd" || true
  echo "  $n trainer(s): $RUNS rounds of $b batches each"
done
$PY - "$dir" "$TRAINERS" <<'PYEOF' | tee "$OUT/trainers.txt"
import glob, os, re, statistics, sys
d, counts = sys.argv[1], [int(x) for x in sys.argv[2].split()]
def stat(path):
    st, samples = {}, 0.0
    for line in open(path):
        if line.startswith("psd_stat "):
            st = {k: float(v) for k, v in re.findall(r"(\w+)=(\S+)", line)}
        m = re.match(r"psd_samples_total (\S+)", line)
        if m:
            samples = float(m.group(1))
    return st, samples
def pct(v, p):
    s = sorted(v)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] if s else float("nan")
print("psd + N bench_trainer processes on loopback, MNIST batch 32 (psd's CPU: utime + stime between snapshots;")
print("median of the rounds, all rounds in brackets; latency: the trainers' call times over every round;")
print("trainers: their processes' CPU per sample over every round, us, gRPC's threads included)")
print(f"{'trainers':>8} {'samples/s':>10} {'psd CPU us/sample':>18} {'[rounds]':>22} {'faults':>7} {'ctxsw':>6}"
      f" {'runq ms':>8}   {'Forward p50/p99 ms':>19} {'Backward':>14} {'Step':>14} {'trainers':>10}")
cost = {}
for n in counts:
    cpu, rate, extra = [], [], []
    lat = {"Forward": [], "Backward": [], "Step": []}
    for s0 in sorted(glob.glob(os.path.join(d, f"n{n}-r*-snap0.txt"))):
        (a, sa), (b, sb) = stat(s0), stat(s0.replace("snap0", "snap1"))
        ns = sb - sa
        if ns <= 0 or not a or not b:
            continue
        cpu.append((b["cpu_s"] - a["cpu_s"]) / ns * 1e6)
        rate.append(ns / (b["t"] - a["t"]))
        nb = ns / 32
        extra.append(((b["minflt"] - a["minflt"]) / nb, (b["ctxsw"] - a["ctxsw"]) / nb, (b["runq_s"] - a["runq_s"]) / nb * 1e3))
    tcpu, tsmp = 0.0, 0
    for f in glob.glob(os.path.join(d, f"n{n}-r*-t*.txt")):
        for line in open(f):
            if line.startswith("rpc "):
                _, name, tot, call, ser = line.split()
                if name in lat:
                    lat[name].append(float(tot) / 1e3)
            elif line.startswith("trainer "):
                kv = dict(x.split("=", 1) for x in line.split()[1:] if "=" in x)
                if "cpu_s" in kv:
                    tcpu += float(kv["cpu_s"])
                    tsmp += int(kv["samples"])
    if not cpu:
        continue
    cost[n] = statistics.median(cpu)
    ex = [statistics.median(x[i] for x in extra) for i in range(3)]
    rr = "/".join(f"{c:.0f}" for c in cpu)
    cells = "".join(f" {pct(lat[k], 50):>7.2f}/{pct(lat[k], 99):<7.2f}" if lat[k] else f" {'-':>15}" for k in lat)
    tr = f"{tcpu / tsmp * 1e6:.1f}" if tsmp else "-"
    print(f"{n:>8} {statistics.median(rate):>10.0f} {cost[n]:>18.1f} {rr:>22} {ex[0]:>7.0f} {ex[1]:>6.0f} {ex[2]:>8.2f}  {cells}"
          f" {tr:>10}")
if 2 in cost and 16 in cost:
    g = cost[16] / cost[2]
    print(f"target: psd's CPU per sample at 16 trainers <= 1.10 x at 2: {g:.3f}  {'MET' if g <= 1.10 else 'NOT MET'}")
PYEOF
