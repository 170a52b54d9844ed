#!/usr/bin/env bash
# Runs every fuzz target $BUILD/fuzz/fuzz_<name> (tests/fuzz/fuzz_<name>.c)
# for FUZZ_SECONDS each (default 60) over its committed seed corpus
# tests/fuzz/corpus/<name> (read only) plus a work corpus in
# $BUILD/fuzz/corpus/<name> that persists between runs. Prints each target's
# final stats (executions, coverage) and exits non-zero when any target
# found something; a crash input is saved as $BUILD/fuzz/<name>-crash-*
# (reproduce: $BUILD/fuzz/fuzz_<name> FILE). FUZZ_TARGETS="service config"
# runs only those.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build-fuzz}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
targets=${FUZZ_TARGETS:-$(ls tests/fuzz/fuzz_*.c | sed 's|tests/fuzz/fuzz_\(.*\)\.c|\1|')}
found=0
for t in $targets; do
  bin="$BUILD/fuzz/fuzz_$t"
  [ -x "$bin" ] || { echo "fuzz: $bin is not built (make fuzz)"; exit 2; }
  work="$BUILD/fuzz/corpus/$t"
  mkdir -p "$work"
  log="$BUILD/fuzz/$t-last-run.log"
  echo "fuzz: $t: $bin for ${FUZZ_SECONDS}s (seeds: tests/fuzz/corpus/$t, work corpus: $work, log: $log)"
  # A slow input fails after 20 s (-timeout, libFuzzer's SIGALRM). Not for
  # the service target, which runs oneDNN: its JIT GEMM kernels point rsp at
  # a heap workspace (oneDNN issue #4845, fixed in 3.11), so a signal handler
  # that interrupts one writes its frame into the heap - ASan reported that
  # as a heap-buffer-overflow in libFuzzer's alarm handler on an AVX2 host.
  # There a hang is caught by the run's own time limit instead.
  per_input=-timeout=20
  guard=()
  if [ "$t" = service ]; then per_input=-timeout=0; guard=(timeout -k 10 $((FUZZ_SECONDS + 300))); fi
  set +e
  # One worker; -rss_limit_mb bounds memory; detect_leaks covers every input.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive \
    "${guard[@]}" "$bin" -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 -rss_limit_mb=4096 "$per_input" \
      -max_len=70000 -artifact_prefix="$BUILD/fuzz/$t-" "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  set -e
  [ $rc -ne 124 ] || echo "fuzz: $t: did not end within ${FUZZ_SECONDS} s + 300 s: an input hangs" >>"$log"
  grep -E "^#[0-9]+.*(DONE|pulse|NEW|REDUCE)" "$log" | tail -n 2
  grep -E "^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)" "$log" || true
  cov=$(grep -oE "cov: [0-9]+ ft: [0-9]+" "$log" | tail -n 1)
  echo "fuzz: $t: final coverage: ${cov:-unknown} (cov = edges covered, ft = features); corpus $(ls "$work" | wc -l) inputs"
  if [ $rc -ne 0 ]; then
    found=1
    echo "fuzz: $t: FINDING (exit $rc); see $log:"; grep -E "ERROR|violated|SUMMARY|Test unit written|an input hangs" "$log" | head -n 20
  else
    echo "fuzz: $t: no findings"
  fi
done
[ $found -eq 0 ] || { echo "fuzz: FINDINGS (above)"; exit 1; }
echo "fuzz: every target ran ${FUZZ_SECONDS}s: no findings"
