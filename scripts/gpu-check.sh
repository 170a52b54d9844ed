#!/usr/bin/env bash
# GPU check for a machine with at least one CUDA GPU (about 3-5 minutes on
# one GPU and 16 cores; see docs/gpu.md):
#   1. build with CUDA (nvcc on PATH or in /usr/local/cuda/bin) and check
#      that psd says "CUDA: built";
#   2. run the GPU tests (test_cuda_layers, test_cuda_step, and the cuda
#      parts of test_batch_forward, test_kinds and test_im2col): here a skip
#      is a failure, since a GPU is expected;
#   3. train one epoch with two trainers three times and print samples/s:
#        cpu    : conv cpu,    fc cpu    (the CPU figure)
#        cuda   : conv cuda:0, fc cuda:0 (device-to-device stage boundary)
#        staged : conv cuda:0, fc cuda:0 with PS_CUDA_STAGE_COPY=host, the
#                 path two GPUs without peer access take (pinned host memory)
#      each must reach MIN_ACC on the test set;
#   4. what one backend call costs (bench_cuda_ops: allocation, copies, a
#      1-element op, MNIST's convolutions; 1 and 8 threads), for information;
#      with PROFILE=1 also Nsight Compute's kernel times of its
#      convolution rows (bench/ncu_summary.py);
#   5. (BATCHING=1, the default) issue 22's GPU figure: bench/batching.sh
#      with both stages on cuda:0, 8 bench_trainer processes (MNIST batch
#      32) against psd with batching off, Forwards batched, Forwards and
#      Backwards batched, and both in groups of at most 64 samples,
#      BATCH_REPEAT times alternately (after psd's compute alone on cuda:0,
#      bench_group): samples/s, psd's CPU per sample, the GPU's utilisation,
#      and the target (the better batched >= 4x off).
#      Its results: BATCH_OUT (default /tmp/gpu-check-batching).
# Needs the MNIST IDX files in data/mnist (scripts/fetch-mnist.sh, run by
# `make test`, writes them; copy them over on a machine without network).
#   scripts/gpu-check.sh            BUILD=build TRAINERS=2 EPOCHS=1 MIN_ACC=90
# PREBUILT=1 skips the build and uses the binaries already in $BUILD (a
# machine without this project's build dependencies: scripts/gpu-bundle.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh   # PY, http_get
BUILD=${BUILD:-build}
TRAINERS=${TRAINERS:-2}
EPOCHS=${EPOCHS:-1}
MIN_ACC=${MIN_ACC:-90.0}
DATA=${DATA:-data/mnist}
JOBS=$(nproc 2>/dev/null || echo 2)
t_start=$(date +%s)
say() { echo "gpu-check: $*"; }
die() { echo "gpu-check: FAILED: $*" >&2; exit 1; }
# A failed test or training run is reported and the check goes on, so that
# one session on a GPU machine shows every failure; the exit status is 1.
failures=()
fail() { echo "gpu-check: FAILED: $*" >&2; failures+=("$*"); }

if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
command -v nvcc >/dev/null 2>&1 || die "nvcc not found (install the CUDA toolkit or put it on PATH)"
say "$(nvcc --version | tail -n 1)"
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L | sed 's/^/gpu-check: /' || say "nvidia-smi not found"

if [ "${PREBUILT:-0}" = 1 ]; then
  say "== prebuilt binaries in $BUILD (no build)"
else
  say "== build (make -j$JOBS)"
  make --no-print-directory -j"$JOBS" BUILD="$BUILD" all >"/tmp/gpu-check-build.log" 2>&1 ||
    { tail -n 40 /tmp/gpu-check-build.log; die "build failed (log /tmp/gpu-check-build.log)"; }
  warnings=$(grep -c "warning" /tmp/gpu-check-build.log || true)
  say "build ok, $warnings warning lines (log /tmp/gpu-check-build.log)"
fi
ver=$("$BUILD/bin/psd" --version)
say "$ver"
grep -q "CUDA: built" <<<"$ver" || die "psd was built without CUDA"

say "== GPU tests"
for t in test_cuda_layers test_cuda_step; do
  set +e
  "$BUILD/tests/$t" >"/tmp/gpu-check-$t.log" 2>&1
  rc=$?
  set -e
  if [ $rc -ne 0 ]; then
    tail -n 30 "/tmp/gpu-check-$t.log"
    if [ $rc -eq 77 ]; then fail "$t skipped on a machine that should have a GPU"
    else fail "$t failed (exit $rc, log /tmp/gpu-check-$t.log)"; fi
  else
    say "PASS $t: $(tail -n 1 "/tmp/gpu-check-$t.log")"
  fi
done
grep -h "rel err" /tmp/gpu-check-test_cuda_step.log | sort -k4 -g | tail -n 3 | sed 's/^/gpu-check:   worst: /' || true
# A CPU-and-GPU test whose cuda:0 part must run here: it passes and its log
# has a line matching PATTERN (its "cuda: skipped" is a failure here).
cuda_part() {  # test PATTERN noise-filter
  local t=$1 pattern=$2 noise=$3 log=/tmp/gpu-check-$1.log rc
  set +e
  "$BUILD/tests/$t" >"$log" 2>&1
  rc=$?
  set -e
  if [ $rc -ne 0 ] || ! grep -q "$pattern" "$log"; then
    grep -v "$noise" "$log" | tail -n 30
    fail "$t on cuda:0 (exit $rc, log $log)"
  else
    say "PASS $t (cuda:0 included): $(grep "$pattern" "$log" | tail -n 1)"
  fi
}
# batched training Forwards and Backwards (issue 22 item 4): per-context
# results on cuda:0 equal unbatched ones within 1e-5
cuda_part test_batch_forward "^cuda:0: batched" "ps\[info\]"
# every layer kind's golden cases (PyTorch autograd, tests/golden/kinds.safetensors)
# on cuda:0 - the kernels only a GPU runs (tri_fill, key_pad, the swin kinds' ops, ...)
cuda_part test_kinds "cases on cuda:0" "^ok"
# im2col / col2im (Unfold, Fold) over geometries past the golden cases, equal to ref
cuda_part test_im2col "^cuda: [0-9]* geometries" "^ok"

# what one backend call costs on the GPU (bench/bench_cuda_ops.c): the fixed
# costs (allocation, copies, a 1-element op's launch and synchronisation)
# beside MNIST's ops, 1 and 8 threads at once; for information
if [ -x "$BUILD/bench/bench_cuda_ops" ]; then
  say "== per-call costs on cuda:0 (bench_cuda_ops; for information)"
  "$BUILD/bench/bench_cuda_ops" --threads "1 8" 2>&1 | sed 's/^/gpu-check:   /' || fail "bench_cuda_ops"
fi
# PROFILE=1: where a convolution's GPU time goes - Nsight Compute's kernel
# times of bench_cuda_ops' convolution rows, one thread (bench/ncu_summary.py)
if [ "${PROFILE:-0}" = 1 ]; then
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1 || true)
  if [ -z "$ncu" ] || ! command -v "$PY" >/dev/null 2>&1; then
    say "PROFILE=1: no ncu or python3 here: no kernel times"
  elif "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv "$BUILD/bench/bench_cuda_ops" --threads 1 \
         --calls 2 --reps 2 --only conv >/tmp/gpu-check-ncu.csv 2>/tmp/gpu-check-ncu.err; then
    say "== kernel times (ncu, PROFILE=1): bench_cuda_ops' convolution rows, launches x mean"
    "$PY" bench/ncu_summary.py /tmp/gpu-check-ncu.csv | sed 's/^/gpu-check:   /' || fail "ncu_summary.py"
  else
    tail -n 5 /tmp/gpu-check-ncu.err
    fail "ncu over bench_cuda_ops (log /tmp/gpu-check-ncu.err)"
  fi
fi

[ -f "$DATA/train-images-idx3-ubyte" ] || [ -f "$DATA/train-images-idx3-ubyte.gz" ] ||
  die "no MNIST in $DATA (run scripts/fetch-mnist.sh $DATA where there is network, then copy it here)"

# psd's device memory on /metrics after a GPU run (psd_device_memory_*): its
# live bytes > 0, free <= total, and what psd holds from its pool (live +
# cached) no more than the driver counts for psd's process (nvidia-smi);
# the dashboard's /api/dashboard devices.memory says the same.
device_memory() {  # label metrics_addr psd_pid
  local body live cached free total smi
  body=$(http_get "$2/metrics") || { fail "$1: psd's /metrics not readable"; return 0; }
  live=$(sed -n 's/^psd_device_memory_bytes{device="cuda:0",state="live"} //p' <<<"$body")
  cached=$(sed -n 's/^psd_device_memory_bytes{device="cuda:0",state="cached"} //p' <<<"$body")
  free=$(sed -n 's/^psd_device_memory_free_bytes{device="cuda:0"} //p' <<<"$body")
  total=$(sed -n 's/^psd_device_memory_total_bytes{device="cuda:0"} //p' <<<"$body")
  [ -n "$live" ] && [ -n "$cached" ] && [ -n "$free" ] && [ -n "$total" ] ||
    { fail "$1: no psd_device_memory_* series for cuda:0 on /metrics"; return 0; }
  awk -v l="$live" -v f="$free" -v t="$total" 'BEGIN { exit !(l > 0 && l < t && f <= t) }' ||
    { fail "$1: device memory live $live, free $free, total $total"; return 0; }
  smi=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
        awk -F', *' -v p="$3" '$1 == p { print $2 }' | head -n 1)
  if [ -n "$smi" ]; then
    awk -v u="$((live + cached))" -v s="$smi" 'BEGIN { exit !(u <= s * 1048576) }' ||
      { fail "$1: psd holds $((live + cached)) bytes of cuda:0 by /metrics, more than nvidia-smi's $smi MiB"; return 0; }
  fi
  say "$1: /metrics after training: cuda:0 live $((live >> 20)) MiB, cached $((cached >> 20)) MiB (nvidia-smi:" \
      "psd ${smi:-?} MiB); device free $((free >> 20)) of $((total >> 20)) MiB"
  # the dashboard's Compute card draws /api/dashboard's devices.memory: the same figures (psd idle, seconds apart)
  body=$(http_get "$2/api/dashboard") || { fail "$1: psd's /api/dashboard not readable"; return 0; }
  "$PY" -c '
import json, sys
live, cached, total = (int(a) for a in sys.argv[1:4])
m = {g["device"]: g for g in json.loads(sys.stdin.read())["devices"].get("memory", [])}
g = m.get("cuda:0")
ok = g is not None and g["total"] == total and abs(g["live"] - live) <= 64 << 20 and abs(g["cached"] - cached) <= 64 << 20
print(f"dashboard devices.memory: {g}")
sys.exit(0 if ok else 1)' "$live" "$cached" "$total" <<<"$body" ||
    { fail "$1: /api/dashboard's cuda:0 memory is not /metrics' (live $live, cached $cached, total $total)"; return 0; }
}

# One training run: psd with the given placement, TRAINERS trainers for
# EPOCHS epochs; prints total samples/s (sum over trainers) and accuracy.
train() {  # label conv_device fc_device [env...]
  local label=$1 conv=$2 fc=$3; shift 3
  local port=$(( 20000 + RANDOM % 20000 )) log
  log=$(mktemp -d "/tmp/gpu-check-$label.XXXXXX")
  env "$@" "$BUILD/bin/psd" --config configs/local.yaml --listen "127.0.0.1:$port" \
      --metrics-listen "127.0.0.1:$((port + 1))" \
      --set "model.placement.conv=$conv" --set "model.placement.fc=$fc" 2>"$log/psd.log" &
  local psd=$! pids=() r
  for _ in $(seq 1 600); do  # up to 60 s: CUDA and cuDNN start-up takes a moment
    grep -q "serving model" "$log/psd.log" && break
    kill -0 "$psd" 2>/dev/null || { cat "$log/psd.log"; { fail "$label: psd did not start"; return 0; }; }
    sleep 0.1
  done
  grep -q "serving model" "$log/psd.log" || { kill "$psd"; cat "$log/psd.log"; { fail "$label: psd not serving after 60 s"; return 0; }; }
  for r in $(seq 1 "$TRAINERS"); do
    timeout 300 "$BUILD/bin/ps-train" --config configs/local.yaml --server "127.0.0.1:$port" --rank "$r" \
        --world-size $((TRAINERS + 1)) --data "$DATA" --epochs "$EPOCHS" --log-every 100000 \
        >"$log/t$r.log" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  [ "$conv" = cpu ] || device_memory "$label" "127.0.0.1:$((port + 1))" "$psd"
  kill -TERM "$psd"; wait "$psd" || rc=1
  [ $rc -eq 0 ] || { tail -n 5 "$log"/*.log; { fail "$label: a trainer or psd failed (logs in $log)"; return 0; }; }
  local rate acc_min
  rate=$(sed -n 's/^Rank [0-9]*: .*(\([0-9.]*\) samples\/s)$/\1/p' "$log"/t*.log | awk '{s += $1} END {printf "%.0f", s}')
  acc_min=$(sed -n 's/^Rank [0-9]* accuracy: \([0-9.]*\)%.*/\1/p' "$log"/t*.log | sort -g | head -n 1)
  [ -n "$acc_min" ] || { fail "$label: no accuracy line (logs in $log)"; return 0; }
  awk -v a="$acc_min" -v m="$MIN_ACC" 'BEGIN { exit !(a >= m) }' || { fail "$label: accuracy $acc_min% < $MIN_ACC%"; return 0; }
  printf 'gpu-check: %-7s conv %-7s fc %-7s %6s samples/s (%d trainers)  min accuracy %s%%  %s\n' \
      "$label" "$conv" "$fc" "$rate" "$TRAINERS" "$acc_min" "$(grep -o 'serving model.*' "$log/psd.log" | head -n 1 | sed 's/ on 127.*//')"
  eval "rate_$label=$rate"
}

say "== training, $TRAINERS trainers x $EPOCHS epoch(s)"
rate_cpu=0 rate_cuda=0 rate_staged=0
train cpu cpu cpu
train cuda cuda:0 cuda:0
train staged cuda:0 cuda:0 PS_CUDA_STAGE_COPY=host
say "samples/s: cpu $rate_cpu | cuda:0+cuda:0 $rate_cuda | staged through pinned host $rate_staged" \
    "(x$(awk -v g="$rate_cuda" -v c="$rate_cpu" 'BEGIN { printf "%.2f", (c > 0 ? g / c : 0) }') vs CPU)"

if [ "${BATCHING:-1}" = 1 ]; then
  say "== batching on cuda:0: 8 trainers, batching off / Forwards / Forwards+Backwards / in groups <= 64 samples"
  bout=${BATCH_OUT:-/tmp/gpu-check-batching}
  rm -rf "$bout"
  set +e
  OUT="$bout" BUILD="$BUILD" TRAINERS=8 RUNS=${BATCH_RUNS:-3} ROUND_BATCHES=${BATCH_ROUND_BATCHES:-768} REPEAT=${BATCH_REPEAT:-2} GROUP_REPS=3 \
    PLACE="--set model.placement.conv=cuda:0 --set model.placement.fc=cuda:0" \
    bench/batching.sh >/tmp/gpu-check-batching.log 2>&1
  rc=$?
  set -e
  if [ $rc -ne 0 ] || [ ! -s "$bout/batching.txt" ]; then
    tail -n 30 /tmp/gpu-check-batching.log
    fail "batching bench (exit $rc, log /tmp/gpu-check-batching.log)"
  else
    sed 's/^/gpu-check:   /' "$bout/batching.txt"
  fi
fi
if [ ${#failures[@]} -gt 0 ]; then
  say "${#failures[@]} FAILED after $(( $(date +%s) - t_start )) s:"
  printf 'gpu-check:   %s\n' "${failures[@]}"
  exit 1
fi
say "OK in $(( $(date +%s) - t_start )) s"
