#!/usr/bin/env bash
# make test-slurm: scripts/slurm/ps-cluster.sbatch on a real Slurm that this
# test starts itself (tests/slurm/local-slurm.sh: slurmctld + slurmd n1, n2
# on this machine, both NodeAddr 127.0.0.1). It submits the heterogeneous
# job "2 psd (group 0, node n1) : 2 trainers (group 1, node n2)" with
# scripts/slurm/mnist-2ps.yaml (conv on ps0, fc on ps1), MNIST for
# MAX_BATCHES rounds per trainer, and checks:
#   - the job leaves the queue before the deadline, its result file says ok
#     and `scontrol show job` (while it exists) never shows a failed state;
#   - the generated config gives ps0 and ps1 distinct ports on 127.0.0.1;
#   - both trainers report a test accuracy of at least MIN_ACC percent;
#   - each psd log shows it hosted its own stage (ps0 conv, ps1 fc), drained
#     on SIGTERM, stopped, and wrote its checkpoint part.
# The daemons are stopped (SIGTERM, grace, SIGKILL) and the temp dir
# removed on any exit; KEEP=1 keeps the temp dir for a look.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
BUILD=${BUILD:-build}
DATA=${DATA:-data/mnist}
MAX_BATCHES=${MAX_BATCHES:-125}
MIN_ACC=${MIN_ACC:-70}
JOB_DEADLINE_S=${JOB_DEADLINE_S:-300}
for b in slurmctld slurmd sbatch squeue scontrol; do
  command -v $b >/dev/null || { echo "test-slurm: skipped: $b not found (slurm-wlm; make test-slurm installs it)"; exit 77; }
done
[ -x "$BUILD/bin/psd" ] && [ -x "$BUILD/bin/ps-train" ] || { echo "test-slurm: no $BUILD/bin/psd, ps-train: run make" >&2; exit 1; }
[ -r "$DATA/train-images-idx3-ubyte" ] || { echo "test-slurm: no MNIST in $DATA: scripts/fetch-mnist.sh $DATA" >&2; exit 1; }

. tests/slurm/local-slurm.sh
tmp=$(mktemp -d /tmp/test-slurm.XXXXXX)
chmod 711 "$tmp"
cleanup() {
  local rc=$?
  if [ -n "${job:-}" ]; then sl scancel "$job" 2>/dev/null || true; fi
  slurm_down
  if [ "${KEEP:-0}" = 1 ] || [ $rc -ne 0 ]; then echo "test-slurm: files kept in $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

slurm_up "$tmp/slurm"

# submit_wait RUN_DIR CKPT_DIR TRAINER-ARGS...: submit ps-cluster.sbatch (2 psd
# : 2 trainers), wait (deadline) until it leaves the queue; sets job, base
# (the first psd port) and states (JobStates seen by scontrol while it ran).
submit_wait() {
  local run=$1 ckpt=$2 t0=$SECONDS q s; shift 2
  base=$(slurm_free_port)
  mkdir -p "$ckpt"
  # The groups' sizes are given the way README shows (options before and
  # after ':' replace the script's #SBATCH lines, group by group).
  job=$(sl sbatch --parsable --chdir="$repo" --output="$run.out" \
    --export=ALL,PS_HOME="$repo",PS_BIN="$repo/$BUILD/bin",PS_RUN_DIR="$run",PS_BASE_PORT="$base",PS_WAIT_S=60,PS_PSD_ARGS="--checkpoint-dir $ckpt" \
    -N1 -n2 : -N1 -n2 scripts/slurm/ps-cluster.sbatch scripts/slurm/mnist-2ps.yaml "$@")
  job=${job%%;*}
  echo "test-slurm: submitted job $job (2 psd : 2 trainers: $*; ports from $base)"
  states=""
  while :; do
    q=$(sl squeue -h -j "$job" -o '%i %t %R' 2>/dev/null || true)
    [ -z "$q" ] && break
    s=$(sl scontrol show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | sort -u | tr '\n' ' ' || true)
    case "$states" in *"$s"*) ;; *) states="$states$s"; echo "  $(( SECONDS - t0 ))s: $s";; esac
    [ $((SECONDS - t0)) -lt "$JOB_DEADLINE_S" ] || { cat "$run.out" 2>/dev/null; fail "job $job still queued/running after ${JOB_DEADLINE_S}s: $q"; }
    sleep 1
  done
  echo "test-slurm: job $job left the queue after $(( SECONDS - t0 ))s"
  echo "---- job output"; cat "$run.out" 2>/dev/null || true; echo "----"
  job=""
}

start=$SECONDS
run=$tmp/run
submit_wait "$run" "$tmp/ckpt" mnist --data "$DATA" --max-batches "$MAX_BATCHES" --log-every 50

case "$states" in *FAIL*|*CANCEL*|*TIMEOUT*|*NODE_FAIL*|*OUT_OF_ME*) fail "job states seen: $states";; esac
[ -f "$run/result" ] || fail "the job wrote no $run/result"
[ "$(cat "$run/result")" = ok ] || fail "job result: $(cat "$run/result")"

# The generated config: ps0 and ps1 on 127.0.0.1 with distinct ports.
a0=$(sed -n '/^  ps0:$/,/address:/s/.*address: "\(.*\)"/\1/p' "$run/cluster.yaml")
a1=$(sed -n '/^  ps1:$/,/address:/s/.*address: "\(.*\)"/\1/p' "$run/cluster.yaml")
[ "$a0" = "127.0.0.1:$base" ] && [ "$a1" = "127.0.0.1:$((base + 1))" ] ||
  fail "generated servers: ps0 '$a0', ps1 '$a1'; want 127.0.0.1:$base and :$((base + 1))"

for r in 1 2; do
  line=$(grep -m1 "^Rank $r accuracy:" "$run/rank$r.log" || true)
  [ -n "$line" ] || { tail -n 20 "$run/rank$r.log" >&2; fail "rank $r reported no accuracy"; }
  acc=$(echo "$line" | sed 's/.*accuracy: \([0-9.]*\)%.*/\1/')
  awk -v a="$acc" -v m="$MIN_ACC" 'BEGIN { exit !(a >= m) }' || fail "rank $r: $line (want >= $MIN_ACC%)"
  echo "ok: $line"
done

for k in 0 1; do
  log=$run/ps$k.log
  stage=$([ $k = 0 ] && echo conv || echo fc)
  other=$([ $k = 0 ] && echo fc || echo conv)
  serving=$(grep -m1 "serving model mnist_cnn" "$log" || true)
  case "$serving" in
    *"$stage on cpu"*) case "$serving" in *"$other on "*) fail "ps$k hosts $other too: $serving";; esac ;;
    *) cat "$log" >&2; fail "ps$k.log does not show it serving $stage";;
  esac
  grep -q "received: draining" "$log" || { tail "$log" >&2; fail "ps$k did not drain on SIGTERM"; }
  grep -q "checkpoint written: $tmp/ckpt/ps$k/" "$log" || { tail "$log" >&2; fail "ps$k wrote no checkpoint part in $tmp/ckpt/ps$k"; }
  grep -q "stopped: model version" "$log" || { tail "$log" >&2; fail "ps$k did not stop cleanly"; }
  echo "ok: ps$k: ${serving#*] }"
  echo "    $(grep -m1 'stopped:' "$log" | sed 's/^.*stopped/stopped/')"
done

# A failing trainer fails the job, and the servers are still stopped cleanly.
submit_wait "$tmp/bad" "$tmp/ckpt-bad" mnist --data "$tmp/no-such-dir" --max-batches 5
grep -q "^failed: trainers [1-9]" "$tmp/bad/result" || fail "trainers failed, job result: '$(cat "$tmp/bad/result" 2>/dev/null)'"
case "$states" in *FAIL*) ;; *) echo "  (scontrol saw no FAILED state: $states; the result file decides)";; esac
for k in 0 1; do
  grep -q "stopped: model version" "$tmp/bad/ps$k.log" || { tail "$tmp/bad/ps$k.log" >&2; fail "ps$k did not stop cleanly after the trainers failed"; }
done
echo "ok: trainers failing fails the job ($(cat "$tmp/bad/result")), both psd stopped cleanly"
echo "test-slurm: passed ($(( SECONDS - start ))s from submit to checks)"
