#!/usr/bin/env bash
# Runs every test: the unit test programs build/tests/test_* and the
# integration scripts tests/it_*.sh. Exit 77 means "skipped" (e.g. no GPU)
# and is reported as such, never as passed. Ends with the line
#   N passed, M failed, K skipped
# and exits non-zero when anything failed. While a test runs: a live line
# on a terminal ("running it_lm (31/45) 12s"), otherwise a line every
# minute it is still running.
#   tests/run.sh            everything
#   tests/run.sh --unit     unit programs only
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
pass=0 fail=0 skip=0
failed=()
logdir=$(mktemp -d /tmp/ps-tests.XXXXXX)
tty=0; [ -t 1 ] && tty=1
n_done=0 n_all=0

run_one() {  # name, command...
  local name=$1; shift
  local log="$logdir/$name.log" t0 t1 rc pid q=0 s
  t0=$(date +%s%N)
  n_done=$((n_done + 1))
  "$@" >"$log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 0.25; q=$((q + 1))
    [ $((q % 4)) -eq 0 ] || continue
    s=$((q / 4))
    if [ $tty -eq 1 ]; then printf '\r\033[Krunning %s (%d/%d) %ds' "$name" "$n_done" "$n_all" "$s"
    elif [ $((s % 60)) -eq 0 ]; then echo "      $name still running (${s}s)"; fi
  done
  wait "$pid"
  rc=$?
  [ $tty -eq 1 ] && printf '\r\033[K'
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

for t in "$BUILD"/tests/test_*; do [ -x "$t" ] && n_all=$((n_all + 1)); done
[ "${1:-}" != "--unit" ] && for s in tests/it_*.sh; do [ -f "$s" ] && n_all=$((n_all + 1)); done
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
