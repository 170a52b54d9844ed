#!/usr/bin/env bash
# The "no slower than before" part of `make bench` (issue 18): MNIST's
# in-process training step (bench_compute, dnnl, 1 and 2 threads) and psd + 2
# bench_trainer processes, for this checkout (head) and for a base commit
# built in a git worktree, run alternately (base, head, base, head, ...) so
# that the machine's load drifts over both alike. Prints one line per
# measurement and the head/base ratios of the medians; the target is >= 0.95
# for each.
#
#   OUT=dir bench/vs_base.sh
#   BASE_REV=REV      the base commit (default: the last commit before the
#                     graph executor, the parent of the commit that added
#                     common/nn/modeldef.c)
#   BASE_TREE=DIR     a checkout of the base already built (its build/): no
#                     worktree, no build
#   ROUNDS=N          alternations (default 5), SECS=T per in-process
#                     measurement (default 2), E2E_BATCHES/E2E_WARMUP per
#                     trainer and psd run (default 150/20)
#
# The base worktree lives under $BUILD/bench-base/<rev> and is built there
# once (make in it, its own build/; a few minutes on 2 cores); later runs
# reuse it. Each side runs its own psd with its own configs/local.yaml.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DATA=${DATA:-data/mnist}
OUT=${OUT:-$(mktemp -d /tmp/bench-base.XXXXXX)}
ROUNDS=${ROUNDS:-5}
SECS=${SECS:-2}
E2E_BATCHES=${E2E_BATCHES:-150}
E2E_WARMUP=${E2E_WARMUP:-20}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
mkdir -p "$OUT"
DATA=$(cd "$DATA" && pwd)
HEAD_TREE=$PWD

if [ -n "${BASE_TREE:-}" ]; then
  base=$(git -C "$BASE_TREE" rev-parse --short HEAD)
else
  if [ -z "${BASE_REV:-}" ]; then
    added=$(git log -1 --format=%H --diff-filter=A -- common/nn/modeldef.c)
    [ -n "$added" ] || { echo "vs_base: no commit adds common/nn/modeldef.c; set BASE_REV" >&2; exit 2; }
    BASE_REV=$added^
  fi
  base=$(git rev-parse --short "$BASE_REV")
  BASE_TREE=$PWD/$BUILD/bench-base/$base
  if [ ! -d "$BASE_TREE" ]; then
    mkdir -p "$(dirname "$BASE_TREE")"
    git worktree add --detach "$BASE_TREE" "$base" >/dev/null
  fi
  echo "vs_base: building $base in $BASE_TREE (once)"
  make -C "$BASE_TREE" -s -j2 build/bin/psd build/bench/bench_compute build/bench/bench_trainer \
    >"$OUT/base-build.log" 2>&1 || { tail -n 20 "$OUT/base-build.log"; echo "vs_base: the base did not build" >&2; exit 1; }
fi
head=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!build' 2>/dev/null || echo "+")
echo "vs_base: base $base ($BASE_TREE), head $head ($HEAD_TREE), $ROUNDS rounds"

compute() {  # side tree threads
  "$2/build/bench/bench_compute" --backend dnnl --threads "$3" --reps 1 --secs "$SECS" --data "$DATA" \
    | awk -v side="$1" -v t="$3" '/what=step/ { for (i = 1; i <= NF; i++) if ($i ~ /^median=/) { sub("median=", "", $i); v = $i } }
                        END { if (v == "") exit 1; printf "vs_base side=%s what=step%s value=%s\n", side, t, v }'
}
e2e() {  # side tree -> total samples/s of psd + 2 trainers
  local side=$1 tree=$2 port=$(( 20000 + RANDOM % 20000 ))
  local addr="127.0.0.1:$port" dir="$OUT/e2e-$side" pids=()
  mkdir -p "$dir"
  (cd "$tree" && exec build/bin/psd --config configs/local.yaml --listen "$addr") 2>"$dir/psd.log" &
  local psd=$!
  for r in 1 2; do
    "$tree/build/bench/bench_trainer" --server "$addr" --rank "$r" --batches "$E2E_BATCHES" --warmup "$E2E_WARMUP" \
      --data "$DATA" --out "$dir/t$r.txt" >/dev/null &
    pids+=($!)
  done
  local ok=1
  for p in "${pids[@]}"; do wait "$p" || ok=0; done
  kill -TERM "$psd"; wait "$psd" || true
  [ $ok = 1 ] || { echo "vs_base: a $side trainer failed (see $dir)" >&2; return 1; }
  cat "$dir/t1.txt" "$dir/t2.txt" | awk -v side="$side" '/^trainer / {
      for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
      s += f["samples"]; if (lo == "" || f["t_start"] < lo) lo = f["t_start"]; if (f["t_end"] > hi) hi = f["t_end"] }
    END { printf "vs_base side=%s what=e2e2 value=%.1f\n", side, s / (hi - lo) }'
}

: >"$OUT/vs_base.txt"
for round in $(seq 1 "$ROUNDS"); do
  for side in base head; do
    tree=$BASE_TREE; [ $side = head ] && tree=$HEAD_TREE
    { compute $side "$tree" 1; compute $side "$tree" 2; e2e $side "$tree"; } | tee -a "$OUT/vs_base.txt"
  done
done
awk -v base="$base" -v head="$head" '
  { for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
    k = f["what"] SUBSEP f["side"]; n[k]++; v[k, n[k]] = f["value"] + 0 }
  function median(k,   m, i, j, t, a) {
    m = n[k]; for (i = 1; i <= m; i++) a[i] = v[k, i]
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2 }
  END {
    printf "MNIST, head %s vs the pre-executor base %s, run alternately (samples/s, medians of %d)\n", head, base, n["step1" SUBSEP "base"]
    split("step1 step2 e2e2", ws, " ")
    names["step1"] = "in-process step, 1 thread"; names["step2"] = "in-process step, 2 threads"
    names["e2e2"] = "psd + 2 trainers, total"
    for (w = 1; w <= 3; w++) {
      b = median(ws[w] SUBSEP "base"); h = median(ws[w] SUBSEP "head")
      printf "   %-30s base %8.0f  head %8.0f  head/base %5.2f (target >= 0.95) %s\n", names[ws[w]], b, h, h / b,
             (h / b >= 0.95 ? "MET" : "NOT MET")
    } }' "$OUT/vs_base.txt" | tee "$OUT/base-report.txt"
