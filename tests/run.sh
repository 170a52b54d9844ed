#!/usr/bin/env bash
# Runs every test: the unit test programs build/tests/test_* and the
# integration scripts tests/it_*.sh. Exit 77 means "skipped" (e.g. no GPU)
# and is reported as such, never as passed. Ends with the line
#   N passed, M failed, K skipped
# and exits non-zero when anything failed.
#   tests/run.sh            everything
#   tests/run.sh --unit     unit programs only
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
pass=0 fail=0 skip=0
failed=()
logdir=$(mktemp -d /tmp/ps-tests.XXXXXX)

run_one() {  # name, command...
  local name=$1; shift
  local log="$logdir/$name.log" t0 t1 rc
  t0=$(date +%s%N)
  "$@" >"$log" 2>&1
  rc=$?
  t1=$(date +%s%N)
  local ms=$(( (t1 - t0) / 1000000 ))
  local secs="$((ms / 1000)).$(( (ms % 1000) / 100 ))"
  if [ $rc -eq 0 ]; then
    pass=$((pass + 1)); echo "PASS  $name (${secs}s)  $(tail -n 1 "$log")"
  elif [ $rc -eq 77 ]; then
    skip=$((skip + 1)); echo "SKIP  $name  $(grep -m1 'skipped' "$log" || tail -n 1 "$log")"
  else
    fail=$((fail + 1)); failed+=("$name"); echo "FAIL  $name (exit $rc, ${secs}s); last lines of $log:"
    tail -n 25 "$log" | sed 's/^/      /'
  fi
}

for t in "$BUILD"/tests/test_*; do
  [ -x "$t" ] || continue
  run_one "$(basename "$t")" "$t"
done
if [ "${1:-}" != "--unit" ]; then
  for s in tests/it_*.sh; do
    [ -f "$s" ] || continue
    run_one "$(basename "$s" .sh)" env BUILD="$BUILD" bash "$s"
  done
fi
echo
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}  (logs in $logdir)"
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
