#!/usr/bin/env bash
# bench/compare.sh REF - this tree against commit REF, on the same machine
# and data, measured alternately so that load drifting over time hits both
# builds alike:
#   e2e   MNIST end to end: psd (configs/local.yaml) and one bench_trainer
#         process (E2E_BATCHES timed batches of 32 after E2E_WARMUP), samples/s
#   step  the in-process training step (bench_compute what=step: forward
#         with tape, backward, SGD step; batch 32, 2 threads), samples/s
# REF is built in a temporary git worktree (removed at the end); this tree
# is built in $BUILD. Each build runs ROUNDS times per measurement, the
# order new, old, new, old, ...; the medians are compared:
#   e2e  new 1012.3 old 1004.1 samples/s  new/old 1.008
#   step new  931.0 old  925.5 samples/s  new/old 1.006
# and the script fails when a ratio is below MIN_RATIO (default 0.97).
# A shared or busy machine makes single figures noisy: read the ratio with
# the load average it prints, and run it on a quiet machine to decide.
#
#   bench/compare.sh main            ROUNDS=5 bench/compare.sh HEAD~3
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: bench/compare.sh REF   (a commit, branch or tag)" >&2; exit 2; }
REF=$1
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DATA=${DATA:-data/mnist}
ROUNDS=${ROUNDS:-3}
E2E_BATCHES=${E2E_BATCHES:-100}
E2E_WARMUP=${E2E_WARMUP:-20}
STEP_SECS=${STEP_SECS:-2}
MIN_RATIO=${MIN_RATIO:-0.97}
JOBS=${JOBS:-$(nproc)}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

ref=$(git rev-parse --verify "$REF^{commit}") || { echo "compare: '$REF' is not a commit" >&2; exit 2; }
tmp=$(mktemp -d /tmp/ps-compare.XXXXXX)
old="$tmp/ref"
psd_pid=
cleanup() {
  [ -z "$psd_pid" ] || kill -9 "$psd_pid" 2>/dev/null || true
  git worktree remove --force "$old" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

echo "compare: this tree ($(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ', with uncommitted changes')) against $REF ($(git rev-parse --short "$ref"))"
echo "compare: building this tree in $BUILD and $REF in $old (-j$JOBS)"
scripts/fetch-mnist.sh "$DATA" >/dev/null
make --no-print-directory -j"$JOBS" "$BUILD/bin/psd" "$BUILD/bench/bench_trainer" "$BUILD/bench/bench_compute" >"$tmp/build-new.log" 2>&1 ||
  { tail -n 30 "$tmp/build-new.log"; echo "compare: this tree does not build" >&2; exit 1; }
git worktree add --detach "$old" "$ref" >/dev/null 2>&1
make --no-print-directory -C "$old" -j"$JOBS" BUILD=build build/bin/psd build/bench/bench_trainer build/bench/bench_compute \
  >"$tmp/build-old.log" 2>&1 || { tail -n 30 "$tmp/build-old.log"; echo "compare: $REF does not build" >&2; exit 1; }
data=$(cd "$DATA" && pwd)

e2e() {  # build dir -> samples/s of one bench_trainer against its own psd
  local b=$1 port addr out
  port=$(( 20000 + RANDOM % 20000 ))
  addr="127.0.0.1:$port"
  out="$tmp/e2e.txt"
  (cd "$b/.." && exec "$b/bin/psd" --config configs/local.yaml --listen "$addr" 2>"$tmp/psd.log") &
  psd_pid=$!
  local line
  line=$("$b/bench/bench_trainer" --server "$addr" --batches "$E2E_BATCHES" --warmup "$E2E_WARMUP" --data "$data" \
         --out "$out" | grep '^trainer ') || { tail "$tmp/psd.log" >&2; echo "compare: bench_trainer failed" >&2; exit 1; }
  kill -TERM "$psd_pid"; wait "$psd_pid" || true; psd_pid=
  awk '{for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } } END { printf "%.1f\n", v["samples"] / v["wall_s"] }' <<<"$line"
}

step() {  # build dir -> samples/s of the in-process training step
  "$1/bench/bench_compute" --backend dnnl --threads 2 --batch 32 --reps 3 --secs "$STEP_SECS" --data "$data" |
    sed -n 's/.*what=step .*median=\([0-9.]*\).*/\1/p'
}

median() { sort -g | awk '{a[NR] = $1} END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

new_b=$(cd "$BUILD" && pwd)
old_b="$old/build"
: >"$tmp/new.e2e"; : >"$tmp/old.e2e"; : >"$tmp/new.step"; : >"$tmp/old.step"
echo "compare: $ROUNDS rounds, load average $(cut -d' ' -f1-3 /proc/loadavg) at the start"
for r in $(seq 1 "$ROUNDS"); do
  e2e "$new_b" >>"$tmp/new.e2e"; e2e "$old_b" >>"$tmp/old.e2e"
  step "$new_b" >>"$tmp/new.step"; step "$old_b" >>"$tmp/old.step"
  echo "  round $r: e2e new $(tail -n 1 "$tmp/new.e2e") old $(tail -n 1 "$tmp/old.e2e"), step new $(tail -n 1 "$tmp/new.step") old $(tail -n 1 "$tmp/old.step") samples/s"
done
echo "compare: load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"
bad=0
for what in e2e step; do
  n=$(median <"$tmp/new.$what"); o=$(median <"$tmp/old.$what")
  ratio=$(awk -v n="$n" -v o="$o" 'BEGIN { printf "%.3f", (o > 0 ? n / o : 0) }')
  printf "%-4s new %8.1f old %8.1f samples/s  new/old %s\n" "$what" "$n" "$o" "$ratio"
  awk -v r="$ratio" -v m="$MIN_RATIO" 'BEGIN { exit !(r >= m) }' || bad=1
done
[ $bad -eq 0 ] || { echo "compare: new/old below $MIN_RATIO"; exit 1; }
