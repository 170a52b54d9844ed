#!/usr/bin/env bash
# bench/compare.sh REF - this tree against commit REF, on the same machine
# and data, measured alternately so that load drifting over time hits both
# builds alike:
#   e2e   MNIST end to end: psd (configs/local.yaml) and E2E_TRAINERS
#         bench_trainer processes at once (default 1; E2E_BATCHES timed
#         batches of 32 each after E2E_WARMUP), samples/s of all together
#   step  the in-process training step (bench_compute what=step: forward
#         with tape, backward, SGD step; batch 32, STEP_THREADS threads,
#         default 2), samples/s
# REF is built in a temporary git worktree (removed at the end); this tree
# is built in $BUILD. Each build runs ROUNDS times per measurement, the
# order new, old, old, new, new, old, ...; each round's new/old is taken,
# and the median of those decides (beside it, the ratio of the medians):
#   e2e  new 1012.3 old 1004.1 samples/s  medians' ratio 1.008, rounds' ratios' median new/old 1.011
#   step new  931.0 old  925.5 samples/s  medians' ratio 1.006, rounds' ratios' median new/old 1.004
# and the script fails when a rounds' ratio is below MIN_RATIO (default 0.97).
# A shared or busy machine makes single figures noisy: read the ratio with
# the load average it prints, and run it on a quiet machine to decide.
#
#   bench/compare.sh main            ROUNDS=5 bench/compare.sh HEAD~3
#   STEP_THREADS=1 E2E_TRAINERS=2 bench/compare.sh df35b72
#         (issue 18's check: the last commit before the graph executor; make
#         bench runs this one, see bench/run.sh)
# REPORT=FILE also writes the result lines there.
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
STEP_THREADS=${STEP_THREADS:-2}
E2E_TRAINERS=${E2E_TRAINERS:-1}
JOBS=${JOBS:-$(nproc)}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

. bench/lib.sh
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

e2e() {  # build dir -> samples/s of E2E_TRAINERS bench_trainers together against their own psd
  local b=$1 port addr r pids=()
  port=$(( 20000 + RANDOM % 20000 ))
  addr="127.0.0.1:$port"
  (cd "$b/.." && exec "$b/bin/psd" --config configs/local.yaml --listen "$addr" 2>"$tmp/psd.log") &
  psd_pid=$!
  # every trainer starts against a listening psd: one that came before it
  # backed off and ran after the others, halving the combined rate
  wait_psd "$addr" || { tail "$tmp/psd.log" >&2; echo "compare: psd did not listen on $addr" >&2; exit 1; }
  # the trainers start their timed batches together (bench_trainer.c says
  # why) where the build's bench_trainer can (an older one cannot)
  local together=()
  if grep -q -- --start-together "$b/bench/bench_trainer"; then
    rm -rf "$tmp/ready"; mkdir -p "$tmp/ready"; together=(--start-together "$tmp/ready" "$E2E_TRAINERS")
  fi
  for r in $(seq 1 "$E2E_TRAINERS"); do
    "$b/bench/bench_trainer" --server "$addr" --rank "$r" --batches "$E2E_BATCHES" --warmup "$E2E_WARMUP" --data "$data" \
      "${together[@]}" --out "$tmp/e2e-t$r.txt" >"$tmp/e2e-o$r.txt" &
    pids+=($!)
  done
  for r in "${pids[@]}"; do
    wait "$r" || { tail "$tmp/psd.log" >&2; echo "compare: bench_trainer failed" >&2; exit 1; }
  done
  kill -TERM "$psd_pid"; wait "$psd_pid" || true; psd_pid=
  # all trainers' samples over the span from the first start to the last end (one clock)
  cat "$tmp"/e2e-o*.txt | grep '^trainer ' | awk '{for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    s += v["samples"]; if (NR == 1 || v["t_start"] < t0) t0 = v["t_start"]; if (v["t_end"] > t1) t1 = v["t_end"] }
    END { printf "%.1f\n", s / (t1 - t0) }'
  rm -f "$tmp"/e2e-o*.txt
}

step() {  # build dir -> samples/s of the in-process training step
  "$1/bench/bench_compute" --backend dnnl --threads "$STEP_THREADS" --batch 32 --reps 3 --secs "$STEP_SECS" --data "$data" |
    sed -n 's/.*what=step .*median=\([0-9.]*\).*/\1/p'
}

median() { sort -g | awk '{a[NR] = $1} END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

new_b=$(cd "$BUILD" && pwd)
old_b="$old/build"
: >"$tmp/new.e2e"; : >"$tmp/old.e2e"; : >"$tmp/new.step"; : >"$tmp/old.step"
echo "compare: step with $STEP_THREADS thread(s), e2e with $E2E_TRAINERS trainer(s); $ROUNDS rounds, load average $(cut -d' ' -f1-3 /proc/loadavg) at the start"
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then   # new first in odd rounds, old first in even ones
    e2e "$new_b" >>"$tmp/new.e2e"; e2e "$old_b" >>"$tmp/old.e2e"
    step "$new_b" >>"$tmp/new.step"; step "$old_b" >>"$tmp/old.step"
  else
    e2e "$old_b" >>"$tmp/old.e2e"; e2e "$new_b" >>"$tmp/new.e2e"
    step "$old_b" >>"$tmp/old.step"; step "$new_b" >>"$tmp/new.step"
  fi
  echo "  round $r: e2e new $(tail -n 1 "$tmp/new.e2e") old $(tail -n 1 "$tmp/old.e2e"), step new $(tail -n 1 "$tmp/new.step") old $(tail -n 1 "$tmp/old.step") samples/s"
done
echo "compare: load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"
bad=0
: >"$tmp/report.txt"
for what in e2e step; do
  n=$(median <"$tmp/new.$what"); o=$(median <"$tmp/old.$what")
  medians=$(awk -v n="$n" -v o="$o" 'BEGIN { printf "%.3f", (o > 0 ? n / o : 0) }')
  # the verdict: the median of the rounds' own ratios (each round runs the
  # two trees a few seconds apart, so a drift of the machine's speed over
  # the minutes of all rounds cancels in it; the medians' ratio does not)
  ratio=$(paste "$tmp/new.$what" "$tmp/old.$what" | awk '$2 > 0 { printf "%.6f\n", $1 / $2 }' | median)
  ratio=$(awk -v r="$ratio" 'BEGIN { printf "%.3f", r }')
  printf "%-4s new %8.1f old %8.1f samples/s  medians' ratio %s, rounds' ratios' median new/old %s\n" "$what" "$n" "$o" \
    "$medians" "$ratio"
  ok=MET
  awk -v r="$ratio" -v m="$MIN_RATIO" 'BEGIN { exit !(r >= m) }' || { bad=1; ok="NOT MET"; }
  if [ "$what" = e2e ]; then label="psd + $E2E_TRAINERS trainer(s)"; else label="in-process step, $STEP_THREADS thread(s)"; fi
  printf "   %-34s this tree %8.1f  %s %8.1f samples/s  rounds' ratio %s (>= %s) %s; medians' %s\n" "$label" "$n" \
    "$(git rev-parse --short "$ref")" "$o" "$ratio" "$MIN_RATIO" "$ok" "$medians" >>"$tmp/report.txt"
done
if [ -n "${REPORT:-}" ]; then
  { echo "   ($ROUNDS rounds alternately; the median of the rounds' new/old, beside the medians'; load average $(cut -d' ' -f1-3 /proc/loadavg) at the end)"
    cat "$tmp/report.txt"; } >"$REPORT"
fi
[ $bad -eq 0 ] || { echo "compare: new/old below $MIN_RATIO"; exit 1; }
