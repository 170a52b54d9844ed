#!/usr/bin/env bash
# Runs a fuzz target (FUZZ_TARGET, default fuzz_service) for FUZZ_SECONDS
# (default 60) over its committed seed corpus (FUZZ_SEEDS, default
# tests/fuzz/corpus; read only) plus a work corpus in
# $BUILD/fuzz/corpus[-TARGET] that persists between runs. Prints libFuzzer's final
# stats (executions, coverage) and exits non-zero on a finding; a crash
# input is saved as $BUILD/fuzz/crash-* (reproduce: $BUILD/fuzz/fuzz_service FILE).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build-fuzz}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
FUZZ_TARGET=${FUZZ_TARGET:-fuzz_service}
FUZZ_SEEDS=${FUZZ_SEEDS:-tests/fuzz/corpus}
bin="$BUILD/fuzz/$FUZZ_TARGET"
work="$BUILD/fuzz/corpus"
[ "$FUZZ_TARGET" = fuzz_service ] || work="$BUILD/fuzz/corpus-$FUZZ_TARGET"
mkdir -p "$work"
log="$BUILD/fuzz/last-run-$FUZZ_TARGET.log"
echo "fuzz: $bin for ${FUZZ_SECONDS}s (seeds: $FUZZ_SEEDS, work corpus: $work, log: $log)"
set +e
# One worker; -rss_limit_mb bounds memory; detect_leaks covers every input.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive \
  "$bin" -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 -rss_limit_mb=4096 -timeout=20 \
    -max_len=70000 -artifact_prefix="$BUILD/fuzz/" "$work" "$FUZZ_SEEDS" >"$log" 2>&1
rc=$?
set -e
grep -E "^#[0-9]+.*(DONE|pulse|NEW|REDUCE)" "$log" | tail -n 3
grep -E "^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)" "$log" || true
cov=$(grep -oE "cov: [0-9]+ ft: [0-9]+" "$log" | tail -n 1)
echo "fuzz: final coverage: ${cov:-unknown} (cov = edges covered, ft = features); corpus $(ls "$work" | wc -l) inputs"
if [ $rc -ne 0 ]; then
  echo "fuzz: FINDING (exit $rc); see $log:"; grep -E "ERROR|violated|SUMMARY|Test unit written" "$log" | head -n 20
  exit 1
fi
echo "fuzz: no findings"
