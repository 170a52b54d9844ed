#!/usr/bin/env bash
# Runs every test: the unit test programs build/tests/test_* and the
# integration scripts tests/it_*.sh. Exit 77 means "skipped" (e.g. no GPU)
# and is reported as such, never as passed. Ends with the line
#   N passed, M failed, K skipped
# and exits non-zero when anything failed. Each test's line gives its wall
# and CPU seconds (user + system of it and the children it waited for); a
# failed test's log follows its line. While tests run: a live line on a
# terminal ("running it_lm, it_hostile (31/45) 12s"), otherwise a line every
# minute a test is still running.
#
# Two at a time: the tests named in SIDE mostly wait (attack durations,
# deadlines, timeouts, SIGSTOPped trainers, waits for a process to notice
# something; the model-export checks for psd's start-up and PyTorch, one
# process at a time: their CPU is a sixth to a third of their wall time)
# rather than compute; they run one after another in a second slot beside
# the others, which run one after another in the first. Every
# test has its own temporary directory and picks its ports at random (or
# lets the kernel pick them), so two never share either. The tests named in
# ALONE assert bounds that another test's load could break (it_hostile: the
# well-behaved client's latency during each attack): nothing runs beside
# them. TEST_JOBS=1 runs everything one at a time, in the usual order.
#   tests/run.sh            everything
#   tests/run.sh --unit     unit programs only
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
TEST_JOBS=${TEST_JOBS:-2}
SIDE=" ${TEST_SIDE-test_consistency test_ctx_table test_rpc test_security test_sync_once it_faults it_faults_split it_faults_sync it_faults_ssp it_py_faults it_py_faults_sync it_py_faults_ssp it_sync_once it_local it_attention it_encoder it_rnn it_upsampling it_userops it_cells it_shared it_elem3 it_buffers it_vae it_shape3 it_sharebn it_ids2 it_elem4 it_multiin it_wnorm it_tdec it_stn it_dist it_seqfit it_unfold} "
ALONE=" ${TEST_ALONE-it_hostile} "
pass=0 fail=0 skip=0
failed=()
logdir=$(mktemp -d /tmp/ps-tests.XXXXXX)
tty=0; [ -t 1 ] && tty=1
n_done=0 n_all=0 sum_ms=0
t_start=$(date +%s%N)

main_q=() side_q=()  # the tests' paths, in order
add() {  # path
  local name; name=$(basename "$1" .sh)
  if [ "$TEST_JOBS" -ge 2 ] && [[ $SIDE == *" $name "* ]]; then side_q+=("$1"); else main_q+=("$1"); fi
  n_all=$((n_all + 1))
}
for t in "$BUILD"/tests/test_*; do [ -x "$t" ] && add "$t"; done
if [ "${1:-}" != "--unit" ]; then
  for s in tests/it_*.sh; do [ -f "$s" ] && add "$s"; done
fi

# The two slots: slot_name[i], slot_pid[i], slot_t0[i] (ns), slot_min[i]
# (minutes reported as still running); name "" when free.
slot_name=("" "") slot_pid=("" "") slot_t0=("" "") slot_min=(0 0)

start() {  # slot path
  local i=$1 name cmd
  name=$(basename "$2" .sh)
  case $2 in *.sh) cmd=(env BUILD="$BUILD" bash "$2") ;; *) cmd=("$2") ;; esac
  local log="$logdir/$name.log"
  # The subshell waits for the test, then its `times` gives the test's CPU.
  ( "${cmd[@]}"; rc=$?; times >"$log.cpu"; exit $rc ) >"$log" 2>&1 &
  slot_name[i]=$name slot_pid[i]=$! slot_t0[i]=$(date +%s%N) slot_min[i]=0
}

finish() {  # slot: reports the test that ran in it (it has ended)
  local i=$1 rc name=${slot_name[$1]}
  local log="$logdir/$name.log"
  wait "${slot_pid[i]}"
  rc=$?
  local ms=$(( ($(date +%s%N) - slot_t0[i]) / 1000000 )) cms
  cms=$(awk 'NR == 2 { s = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); s += a[1] * 60 + a[2] }
                       printf "%d\n", s * 1000 }' "$log.cpu" 2>/dev/null)
  cms=${cms:-0}
  slot_name[i]="" slot_pid[i]=""
  n_done=$((n_done + 1)) sum_ms=$((sum_ms + ms))
  [ $tty -eq 1 ] && printf '\r\033[K'
  local secs="$((ms / 1000)).$(( (ms % 1000) / 100 ))s, cpu $((cms / 1000)).$(( (cms % 1000) / 100 ))s"
  if [ $rc -eq 0 ]; then
    pass=$((pass + 1)); echo "PASS  $name ($secs)  $(tail -n 1 "$log")"
  elif [ $rc -eq 77 ]; then
    skip=$((skip + 1)); echo "SKIP  $name  $(grep -m1 'skipped' "$log" || tail -n 1 "$log")"
  else
    fail=$((fail + 1)); failed+=("$name")
    local lines; lines=$(wc -l <"$log")
    echo "FAIL  $name (exit $rc, $secs); its log $log$([ "$lines" -gt 400 ] && echo ", last 400 of $lines lines"):"
    tail -n 400 "$log" | sed 's/^/      /'
  fi
}

alone() { [[ $ALONE == *" $(basename "$1" .sh) "* ]]; }
q=0
while :; do
  # the next test of the first slot; one in ALONE waits for the second slot
  if [ -z "${slot_name[0]}" ] && [ ${#main_q[@]} -gt 0 ] && { [ -z "${slot_name[1]}" ] || ! alone "${main_q[0]}"; }; then
    start 0 "${main_q[0]}"; main_q=("${main_q[@]:1}")
  fi
  # the second slot's, unless a test in ALONE runs or waits to
  if [ -z "${slot_name[1]}" ] && [ ${#side_q[@]} -gt 0 ] &&
     ! { [ -n "${slot_name[0]}" ] && alone "${slot_name[0]}"; } &&
     ! { [ -z "${slot_name[0]}" ] && [ ${#main_q[@]} -gt 0 ] && alone "${main_q[0]}"; }; then
    start 1 "${side_q[0]}"; side_q=("${side_q[@]:1}")
  fi
  [ -z "${slot_name[0]}${slot_name[1]}" ] && break
  sleep 0.25; q=$((q + 1))
  for i in 0 1; do
    [ -n "${slot_name[i]}" ] && ! kill -0 "${slot_pid[i]}" 2>/dev/null && finish "$i"
  done
  [ $((q % 4)) -eq 0 ] || continue
  if [ $tty -eq 1 ]; then
    names=$(printf '%s\n' "${slot_name[@]}" | sed '/^$/d' | paste -sd, | sed 's/,/, /')
    printf '\r\033[Krunning %s (%d/%d) %ds' "$names" "$((n_done + 1))" "$n_all" "$(( ($(date +%s%N) - t_start) / 1000000000 ))"
  else
    for i in 0 1; do
      [ -n "${slot_name[i]}" ] || continue
      s=$(( ($(date +%s%N) - slot_t0[i]) / 1000000000 ))
      if [ $((s / 60)) -gt "${slot_min[i]}" ]; then
        slot_min[i]=$((s / 60)); echo "      ${slot_name[i]} still running (${s}s)"
      fi
    done
  fi
done
echo
wall=$(( ($(date +%s%N) - t_start) / 1000000000 ))
echo "tests took ${wall}s ($((sum_ms / 1000))s of test time, TEST_JOBS=$TEST_JOBS)"
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}  (logs in $logdir)"
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
