#!/usr/bin/env bash
# The Python client's row of `make bench` (bench/run.sh runs it; alone:
# bench/python.sh): MNIST samples/s of one trainer each, on one psd
# (configs/local.yaml, batch 32) or PyTorch's tutorial:
#   - the Python trainer (examples/mnist_trainer.py on python/psd): the whole
#     model as one RemoteStage (Forward, Backward(step=true)), and the
#     tutorial's split into two RemoteStages (conv, fc);
#   - ps-train's batch (bench/bench_trainer, the same RPCs from C): fused
#     (Forward, Backward(step=true)) and split (Forward, Backward, Step);
#   - the PyTorch RPC parameter-server tutorial (bench/torch_ref.py
#     tutorial: PS + 1 trainer, the faster of 1 and 2 torch threads).
# Each after WARMUP batches, BATCHES timed, REPS runs (median). Writes
# $OUT/python.txt (one line per run) and $OUT/python-report.txt (the table,
# with the target: the Python trainer >= 3x the tutorial).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DATA=${DATA:-data/mnist}
OUT=${OUT:-$BUILD/bench-results/python-$(date +%Y%m%d-%H%M%S)}
BATCHES=${BATCHES:-150}
WARMUP=${WARMUP:-20}
REPS=${REPS:-3}
PY=/usr/bin/python3
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
mkdir -p "$OUT"
: >"$OUT/python.txt"
port=$(( 20000 + RANDOM % 20000 )); addr="127.0.0.1:$port"
"$BUILD/bin/psd" --config configs/local.yaml --listen "$addr" 2>"$OUT/python-psd.log" &
psd=$!
trap 'kill $psd 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  "$BUILD/bin/ps-train" --server "$addr" --status >/dev/null 2>&1 && break; sleep 0.1
done
for rep in $(seq "$REPS"); do
  for mode in fused split; do
    flag=(); [ $mode = split ] && flag=(--split)
    r=$($PY examples/mnist_trainer.py --server "$addr" --data "$DATA" --max-batches $((WARMUP + BATCHES)) \
        --warmup "$WARMUP" --log-every 1000000 --no-eval "${flag[@]}" 2>/dev/null | sed -n 's/.*(\([0-9.]*\) samples\/s).*/\1/p' || true)
    echo "python what=python-$mode rep=$rep samples_s=$r" | tee -a "$OUT/python.txt"
    flag=(); [ $mode = fused ] && flag=(--fuse-step)
    "$BUILD/bench/bench_trainer" --server "$addr" --batches "$BATCHES" --warmup "$WARMUP" --data "$DATA" \
      --out "$OUT/python-c-$mode-$rep.txt" "${flag[@]}" >/dev/null || true
    r=$(awk '/^trainer / { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
             printf "%.1f", v["samples"] / (v["t_end"] - v["t_start"]) }' "$OUT/python-c-$mode-$rep.txt")
    echo "python what=ps-train-$mode rep=$rep samples_s=$r" | tee -a "$OUT/python.txt"
  done
done
kill -TERM $psd; wait $psd || true
trap - EXIT
if [ -z "${SKIP_TORCH:-}" ]; then
  for t in 1 2; do
    # a failed anchor run leaves its row out instead of ending the bench
    { TORCH_THREADS=$t BATCHES=$BATCHES WARMUP=$WARMUP REPS=$REPS $PY bench/torch_ref.py tutorial "$DATA" 2>/dev/null || true; } \
      | sed -n "s/^torch what=tutorial /python what=tutorial-t$t /p" | tee -a "$OUT/python.txt"
  done
fi
$PY - "$OUT/python.txt" <<'EOF' | tee "$OUT/python-report.txt"
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    kv = dict(re.findall(r"(\w+)=(\S+)", line))
    v = kv.get("samples_s") or kv.get("median")
    if v:
        runs.setdefault(kv["what"], []).append(float(v))
med = {k: statistics.median(v) for k, v in runs.items()}
tut = max([v for k, v in med.items() if k.startswith("tutorial")], default=None)
print("7. Python client (python/psd): MNIST, batch 32, 1 trainer each, samples/s (median of runs)")
rows = [("python-fused", "Python trainer, RemoteStage(None): Forward + Backward(step)"),
        ("python-split", "Python trainer, RemoteStage conv + fc (the tutorial's split)"),
        ("ps-train-fused", "ps-train's batch (bench_trainer --fuse-step)"),
        ("ps-train-split", "ps-train's batch (bench_trainer: Forward, Backward, Step)")]
rows += [(k, f"PyTorch RPC tutorial, PS + 1 trainer, torch threads {k[-1]}") for k in sorted(med) if k.startswith("tutorial")]
for k, name in rows:
    if k in med:
        r = "/".join(f"{x:.0f}" for x in runs[k])
        print(f"   {name:<64} {med[k]:8.0f}  ({r})")
if tut and "python-fused" in med:
    for k in ("python-fused", "python-split"):
        if k in med:
            print(f"   {k} / PyTorch tutorial: {med[k] / tut:.2f}x")
    if "ps-train-fused" in med:
        print(f"   python-fused / ps-train-fused: {med['python-fused'] / med['ps-train-fused']:.2f}")
    x = med["python-fused"] / tut
    print(f"   target: the Python trainer >= 3x the tutorial: {x:.1f}x  {'MET' if x >= 3 else 'NOT MET'}")
EOF
