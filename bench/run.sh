#!/usr/bin/env bash
# `make bench`: compute, end-to-end and PyTorch numbers in one run, on the
# same data and machine, then the table and ratios (bench/report.py).
#
#   bench/run.sh                 everything (about 16 minutes on 2 cores, 5 of them building df35b72)
#   QUICK=1 bench/run.sh         fewer/shorter repetitions (a smoke run)
#   SKIP_TORCH=1 bench/run.sh    without the PyTorch anchors
#   ISAS="AVX2 SSE41" bench/run.sh   the ISAs emulated in section 4 (oneDNN's
#                                ONEDNN_MAX_CPU_ISA names; default: those of
#                                AVX2 and SSE41 below the CPU's own; "" none)
#   SKIP_RL=1 bench/run.sh       without the RL part (bench/rl.sh)
#   SKIP_TRAINERS=1 bench/run.sh without psd's cost at 1..16 trainers (bench/trainers.sh)
#   SKIP_PYTHON=1 bench/run.sh   without the Python client's row (bench/python.sh)
#   SKIP_LM=1 bench/run.sh       without the language model's fused mode per ISA
#                                (psd + 2 ps-train lm trainers; make bench-lm has the rest)
#   SKIP_BASE=1 bench/run.sh     without MNIST against the last commit before the graph
#                                executor (bench/compare.sh $BASE_REF, default df35b72:
#                                built in a git worktree, run alternately; issue 18's >= 0.95)
#
# Raw results go to $OUT (default build/bench-results/<date>); the table is
# printed and saved as $OUT/report.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DATA=${DATA:-data/mnist}
OUT=${OUT:-$BUILD/bench-results/$(date +%Y%m%d-%H%M%S)}
PY=/usr/bin/python3
. bench/lib.sh
mkdir -p "$OUT"
if [ -n "${QUICK:-}" ]; then
  REPS=2; SECS=1; E2E_BATCHES=60; E2E_WARMUP=10; T_BATCHES=30; I_REPS=2; I_T_BATCHES=20; LM_WINDOWS=20
else
  REPS=5; SECS=2; E2E_BATCHES=150; E2E_WARMUP=20; T_BATCHES=60; I_REPS=3; I_T_BATCHES=40; LM_WINDOWS=40
fi
LM_DATA=${LM_DATA:-data/fortunes}
# The ISAs this CPU can run below its own, emulated in section 4.
CPU_FLAGS=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has_flags() { local f; for f; do [[ "$CPU_FLAGS" == *" $f "* ]] || return 1; done; }
if [ -z "${ISAS+set}" ]; then
  if has_flags avx512f avx512bw avx512vl avx512dq; then ISAS="AVX2 SSE41"
  elif has_flags avx2 fma; then ISAS="SSE41"
  else ISAS=""; fi
fi
# psd's own default (it re-execs with it); spinning OpenMP workers collapse
# throughput on VMs whose vCPUs share a core, so the bench uses it too.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

# ---- the bench's own dependency: Debian's PyTorch for the anchors
if [ -z "${SKIP_TORCH:-}" ] && ! dpkg-query -W -f='${Status}' python3-torch 2>/dev/null | grep -q "install ok installed"; then
  echo "bench: installing python3-torch (the PyTorch anchors)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends python3-torch
fi

state() {  # the machine's state, at start and end
  echo "== machine ($1)"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -srm); cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(nproc) online CPUs; $(grep -m1 'siblings' /proc/cpuinfo | tr -s '\t ' ' ')"
  echo "cpu ISA extensions: $(for f in avx512f avx512bw avx512_bf16 amx_tile avx2 fma avx sse4_1; do has_flags $f && printf '%s ' $f; done)"
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "busiest other processes (%cpu command):"
  ps -eo pcpu,comm --sort=-pcpu | awk 'NR>1 && NR<=5 {printf "  %s %s\n", $1, $2}'
}

state start | tee "$OUT/machine.txt"
echo "OMP_WAIT_POLICY=$OMP_WAIT_POLICY" | tee -a "$OUT/machine.txt"
# oneDNN's version, runtime and the ISA it dispatches to.
ONEDNN_VERBOSE=1 "$BUILD/bench/bench_compute" --threads 2 --reps 1 --msecs 10 2>&1 | grep -E "^onednn_verbose,info,(oneDNN|cpu)" \
  | sed 's/^onednn_verbose,info,/oneDNN: /' | tee -a "$OUT/machine.txt"
ONEDNN_VERBOSE=1 "$BUILD/bench/bench_compute" --reps 1 --msecs 10 2>&1 | grep "^onednn_verbose,exec" \
  | awk -F, '$4=="convolution" && $6=="forward_training" {print "oneDNN conv kernels: " $5 " " $(NF-1)}' | sort -u \
  | tee -a "$OUT/machine.txt"

# the FP32 FMA peak of a core at the vector width of oneDNN's ISA (bench/fma_peak.c)
"$BUILD/bench/fma_peak" | tee "$OUT/fma.txt"
[ -n "${SKIP_LM:-}" ] || scripts/fetch-fortunes.sh "$LM_DATA" >/dev/null

# The language model's fused mode, psd + 2 trainers, at the ISA oneDNN uses
# now (the caller's ONEDNN_MAX_CPU_ISA): one line into lm.txt with the ISA's
# name as fma_peak prints it (the report divides by that ISA's FMA peak).
lm_fused() {  # label
  [ -z "${SKIP_LM:-}" ] || return 0
  local isa tps
  isa=$("$BUILD/bench/fma_peak" --isa)
  tps=$(lm_tokens fused 2 "$LM_WINDOWS" "$LM_DATA" "$OUT/lm-$1") \
    || { echo "bench: the language model's run failed ($1); logs in $OUT/lm-$1" >&2; return 0; }
  echo "lm label=$1 isa=$isa mode=fused trainers=2 windows=$LM_WINDOWS tokens_s=$tps flop_per_token=$(lm_flop_per_token)" \
    "$(cat "$OUT/lm-$1/cpu-fused-2.txt" "$OUT/lm-$1/lock-fused-2.txt" 2>/dev/null | tr '\n' ' ')" \
    | tee -a "$OUT/lm.txt"
}

# ---- 1. compute only, in-process
echo "== compute (in-process, batch 32, median of $REPS x ${SECS}s)"
: >"$OUT/compute.txt"
for be in dnnl ref; do
  for t in 1 2; do
    s=$SECS; r=$REPS
    [ "$be" = ref ] && { s=1; r=3; }
    "$BUILD/bench/bench_compute" --backend "$be" --threads "$t" --reps "$r" --secs "$s" --data "$DATA" --profile \
      | tee -a "$OUT/compute.txt"
  done
done
# two single-thread steps at once, in two processes (what two trainers' calls
# could do on two cores with nothing between them); the report adds them up
"$BUILD/bench/bench_compute" --backend dnnl --threads 1 --reps "$REPS" --secs "$SECS" --data "$DATA" \
  | sed 's/^compute /compute concurrent=2 proc=1 /' >"$OUT/concurrent1.txt" &
cpid=$!
"$BUILD/bench/bench_compute" --backend dnnl --threads 1 --reps "$REPS" --secs "$SECS" --data "$DATA" \
  | sed 's/^compute /compute concurrent=2 proc=2 /' >"$OUT/concurrent2.txt"
wait "$cpid"
cat "$OUT/concurrent1.txt" "$OUT/concurrent2.txt" | tee -a "$OUT/compute.txt"
# two single-thread steps at once in one process on one model (psd's hogwild
# with its weight snapshots, without the RPC): what psd + 2 trainers could
# reach if the RPC cost nothing; the report sets psd beside it
"$BUILD/bench/bench_compute" --backend dnnl --threads 1 --parallel 2 --snapshots --reps "$REPS" --secs "$SECS" \
  --data "$DATA" | tee -a "$OUT/compute.txt"
# the plain-layout oneDNN path, kept for comparison
for t in 1 2; do
  PS_DNNL_LAYOUT=plain "$BUILD/bench/bench_compute" --backend dnnl --threads "$t" --reps "$REPS" --secs "$SECS" \
    --data "$DATA" --profile | sed 's/backend=dnnl/backend=dnnl-plain/' | tee -a "$OUT/compute.txt"
done

# ---- 2. end to end: psd + N trainers on loopback
pair_step() {  # FILE: one short 1-thread in-process step (PAIR_STEP: bench_compute's model/batch flags)
  # shellcheck disable=SC2086
  "$BUILD/bench/bench_compute" --backend dnnl --threads 1 --reps 1 --secs "$SECS" --data "$DATA" $PAIR_STEP \
    | grep '^compute ' >"$1" || true
}
echo "== end to end (psd + N bench_trainer processes, $E2E_BATCHES timed batches each after $E2E_WARMUP, $REPS runs)"
e2e() {  # label, trainers, psd flags..., -- trainer flags...
  local label=$1 n=$2; shift 2
  local pflags=() tflags=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do pflags+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  tflags=("$@")
  local port; port=$(bench_port)
  local addr="127.0.0.1:$port" maddr="127.0.0.1:$((port + 1))" dir="$OUT/e2e-$label-$n"
  mkdir -p "$dir"
  # E2E_LOCAL=1: the trainers dial psd's local transport (server.local_socket) instead of its gRPC port
  if [ -n "${E2E_LOCAL:-}" ]; then pflags+=(--set "server.local_socket=$dir/psd.sock"); addr="local:$dir/psd.sock"; fi
  "$BUILD/bin/psd" --config "${E2E_CONFIG:-configs/local.yaml}" --listen "127.0.0.1:$port" --metrics-listen "$maddr" \
    "${pflags[@]}" 2>"$dir/psd.log" &
  local psd=$!
  wait_psd "$maddr" || true
  # a short round first (kernels, buffer pools, connections), then psd's
  # counters around the timed runs: its CPU and its calls' phases
  local wpids=()
  for r in $(seq 1 "$n"); do
    "$BUILD/bench/bench_trainer" --server "$addr" --rank "$r" --batches 3 --warmup 0 --data "$DATA" \
      "${tflags[@]}" >/dev/null &
    wpids+=($!)
  done
  for p in "${wpids[@]}"; do wait "$p"; done
  psd_snap "$psd" "$maddr" "$dir/snap0.txt"
  local runs=$REPS; [ "$runs" -gt 3 ] && runs=3
  # PAIR_STEP set (bench_compute's flags for the same model and batch; ""
  # for MNIST's): the 1-thread in-process step measured before the first
  # repetition and after each, so each repetition's ratio has a step of the
  # same minutes beside it (this machine's speed drifts between sections)
  [ -n "${PAIR_STEP+set}" ] && pair_step "$dir/pair0.txt"
  for rep in $(seq 1 "$runs"); do
    local pids=()
    # the trainers start their timed batches together (bench_trainer.c says why)
    rm -rf "$dir/ready-$rep"; mkdir -p "$dir/ready-$rep"
    for r in $(seq 1 "$n"); do
      "$BUILD/bench/bench_trainer" --server "$addr" --rank "$r" --batches "$E2E_BATCHES" --warmup "$E2E_WARMUP" \
        --start-together "$dir/ready-$rep" "$n" \
        --data "$DATA" --out "$dir/rep$rep-t$r.txt" "${tflags[@]}" >/dev/null &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    [ -n "${PAIR_STEP+set}" ] && pair_step "$dir/pair$rep.txt"
  done
  psd_snap "$psd" "$maddr" "$dir/snap1.txt"
  echo "psd_peak_rss_kb $(awk '/VmHWM/ {print $2}' /proc/$psd/status)" >"$dir/psd_rss.txt"
  kill -TERM "$psd"; wait "$psd" || true
  echo "  $label, $n trainer(s): $(cat "$dir/psd_rss.txt")"
}
e2e split 1
PAIR_STEP="" e2e split 2
e2e split 4
e2e fused 2 -- --fuse-step
# one call a batch (ps-train's default; bench_trainer --one-call): Forward with the batch's class ids
# and step=true, psd's cross-entropy, backward and step; adjacent steps too
PAIR_STEP="" e2e one 2 -- --one-call
# the same through psd's local transport (trainers on psd's host: a unix socket and shared memory)
E2E_LOCAL=1 PAIR_STEP="" e2e local 2 -- --one-call
# every call on one compute thread (server.compute_threads=1) instead of psd's
# share of the cores per call: tells on a quiet machine whether calls given
# two threads (when the other trainer is between calls) cost more than they give
e2e ct1 2 --set server.compute_threads=1
# oneDNN on plain layouts (the path before blocked layouts), 2 trainers
PS_DNNL_LAYOUT=plain e2e plain-layout 2
# the RPC cost of a batch without compute (bench_trainer --probe), under training load
for n in 1 2; do e2e probe "$n" -- --probe; done
# the language model, fused decoder, 2 trainers (bench/lm.sh has the rest)
[ -n "${SKIP_LM:-}" ] || { echo "== language model: psd + 2 ps-train lm trainers, fused mode, $LM_WINDOWS windows each"; lm_fused host; }

# ---- 3. the anchors: PyTorch's tutorial and a local PyTorch loop
if [ -z "${SKIP_TORCH:-}" ]; then
  echo "== PyTorch $($PY -c 'import torch; print(torch.__version__)' 2>/dev/null) (Debian python3-torch), $T_BATCHES batches x $REPS after warm-up"
  : >"$OUT/torch.txt"
  for t in 1 2; do
    TORCH_THREADS=$t BATCHES=$T_BATCHES REPS=$REPS $PY bench/torch_ref.py local "$DATA" 2>/dev/null | tee -a "$OUT/torch.txt"
  done
  for t in 1 2; do
    TORCH_THREADS=$t BATCHES=$T_BATCHES REPS=$REPS $PY bench/torch_ref.py tutorial "$DATA" 2>/dev/null | grep '^torch' \
      | tee -a "$OUT/torch.txt"
  done
fi

# ---- 4. per ISA: oneDNN capped to each lower ISA (ONEDNN_MAX_CPU_ISA; it
# can only lower it), the in-process step and psd + 2 trainers, beside
# PyTorch's tutorial capped the same way (ONEDNN_MAX_CPU_ISA for its oneDNN
# convolutions, ATEN_CPU_CAPABILITY for ATen's kernels; no SSE4.1 level in
# ATen: "default"). The host's own ISA is sections 1-3.
for isa in $ISAS; do
  low=$(echo "$isa" | tr 'A-Z' 'a-z')
  case $isa in AVX512*) aten=avx512 ;; AVX2) aten=avx2 ;; *) aten=default ;; esac
  echo "== ISA $isa (emulated: ONEDNN_MAX_CPU_ISA=$isa, torch ATEN_CPU_CAPABILITY=$aten)"
  (
    export ONEDNN_MAX_CPU_ISA=$isa
    "$BUILD/bench/fma_peak" | tee -a "$OUT/fma.txt"
    for t in 1 2; do
      "$BUILD/bench/bench_compute" --backend dnnl --threads "$t" --reps "$I_REPS" --secs 1 --data "$DATA" --profile \
        | sed "s/backend=dnnl/backend=dnnl@$low/" | tee -a "$OUT/compute.txt"
    done
    PAIR_STEP="" e2e "isa@$low" 2
    PAIR_STEP="" e2e "one@$low" 2 -- --one-call
    lm_fused "$low"
    if [ -z "${SKIP_TORCH:-}" ]; then
      for t in 1 2; do
        ATEN_CPU_CAPABILITY=$aten TORCH_THREADS=$t BATCHES=$I_T_BATCHES REPS=$I_REPS $PY bench/torch_ref.py tutorial \
          "$DATA" 2>/dev/null | grep '^torch' | sed "s/^torch /torch isa=$low /" | tee -a "$OUT/torch.txt"
      done
    fi
  )
done
# ---- 4b. the small ResNet of examples/models/small_resnet.yaml (a model
# file: conv, BatchNorm, residual Adds, pooling) on the MNIST images, per ISA
# (the host's, then those of $ISAS): its in-process forward and step with 1
# and 2 threads, and psd + 2 trainers serving it; results under $OUT/resnet
# (compute.txt, e2e-<isa>-2), section 7 of the report. Batch RESNET_BATCH
# (64, what make test-fit trains it with): the model is ~1 MFLOP a sample,
# so at MNIST's 32 a batch's compute (~2.4 ms) is not much more than the
# fixed cost of its three calls, which batch 64 halves per sample.
RESNET_BATCH=${RESNET_BATCH:-64}
echo "== small ResNet (examples/models/small_resnet.yaml): in-process and psd + 2 trainers, batch $RESNET_BATCH, per ISA"
mkdir -p "$OUT/resnet"
: >"$OUT/resnet/compute.txt"
cat >"$OUT/resnet/psd.yaml" <<EOF
server: {threads: 4, compute_threads: 0, context_ttl_s: 120, max_message_mb: 64, consistency: hogwild}
model: {file: $PWD/examples/models/small_resnet.yaml, seed: 1, backend: dnnl}
optimizer: {type: sgd, lr: 0.03, momentum: 0, weight_decay: 0}
EOF
for isa in host $ISAS; do
  low=$(echo "$isa" | tr 'A-Z' 'a-z')
  (
    [ "$isa" = host ] || export ONEDNN_MAX_CPU_ISA=$isa
    for t in 1 2; do
      "$BUILD/bench/bench_compute" --model examples/models/small_resnet.yaml --backend dnnl --threads "$t" \
        --batch "$RESNET_BATCH" --reps "$I_REPS" --secs "$SECS" --data "$DATA" --profile | sed "s/backend=dnnl/backend=dnnl@$low/" \
        | tee -a "$OUT/resnet/compute.txt"
    done
    "$BUILD/bench/bench_compute" --model examples/models/small_resnet.yaml --backend dnnl --threads 1 --parallel 2 \
      --snapshots --batch "$RESNET_BATCH" --reps "$I_REPS" --secs "$SECS" --data "$DATA" \
      | sed "s/backend=dnnl/backend=dnnl@$low/" | tee -a "$OUT/resnet/compute.txt"
    E2E_CONFIG="$OUT/resnet/psd.yaml" OUT="$OUT/resnet" \
      PAIR_STEP="--model examples/models/small_resnet.yaml --batch $RESNET_BATCH" e2e "$low" 2 -- --batch-size "$RESNET_BATCH" --loss ce
    E2E_CONFIG="$OUT/resnet/psd.yaml" OUT="$OUT/resnet" \
      PAIR_STEP="--model examples/models/small_resnet.yaml --batch $RESNET_BATCH" e2e "one@$low" 2 -- --batch-size "$RESNET_BATCH" --one-call
    E2E_LOCAL=1 E2E_CONFIG="$OUT/resnet/psd.yaml" OUT="$OUT/resnet" \
      PAIR_STEP="--model examples/models/small_resnet.yaml --batch $RESNET_BATCH" e2e "local@$low" 2 -- --batch-size "$RESNET_BATCH" --one-call
  )
done

# ---- many trainers: psd's CPU per sample at 1..16 trainers (bench/trainers.sh)
if [ -z "${SKIP_TRAINERS:-}" ]; then
  OUT="$OUT" BUILD="$BUILD" DATA="$DATA" RUNS=$([ -n "${QUICK:-}" ] && echo 2 || echo 3) bash bench/trainers.sh
fi

# ---- MNIST against the last commit before the graph executor (issue 18: the
# in-process 1-thread step and psd + 2 trainers >= 0.95 x that commit's), built
# in a git worktree and run alternately with this tree (bench/compare.sh)
if [ -z "${SKIP_BASE:-}" ]; then
  echo "== MNIST vs ${BASE_REF:-df35b72} (the last commit before the graph executor), alternately"
  STEP_THREADS=1 E2E_TRAINERS=2 MIN_RATIO=0.95 ROUNDS=$([ -n "${QUICK:-}" ] && echo 2 || echo 3) \
    E2E_BATCHES=$E2E_BATCHES E2E_WARMUP=$E2E_WARMUP STEP_SECS=$SECS BUILD="$BUILD" DATA="$DATA" \
    REPORT="$OUT/base.txt" bash bench/compare.sh "${BASE_REF:-df35b72}" || true
fi

# ---- 5. RL: the tutorial's REINFORCE agent and observers (bench/rl.sh)
if [ -z "${SKIP_RL:-}" ]; then
  echo "== RL: psd + ps-train cartpole vs the PyTorch RPC tutorial, 2 and 4 observers"
  OUT="$OUT" BUILD="$BUILD" ROUNDS=$([ -n "${QUICK:-}" ] && echo 10 || echo 30) bash bench/rl.sh >/dev/null
fi

# ---- 6. the Python client: python/psd's trainer beside ps-train's batch and the tutorial (bench/python.sh)
if [ -z "${SKIP_PYTHON:-}" ]; then
  echo "== Python client: examples/mnist_trainer.py vs ps-train's batch and the PyTorch tutorial, 1 trainer each"
  OUT="$OUT" BUILD="$BUILD" DATA="$DATA" BATCHES=$([ -n "${QUICK:-}" ] && echo 60 || echo 150) REPS=$([ -n "${QUICK:-}" ] && echo 2 || echo 3) \
    bash bench/python.sh >/dev/null
fi

state end >>"$OUT/machine.txt"
{ $PY bench/report.py "$OUT"
  if [ -f "$OUT/trainers.txt" ]; then echo; echo "9. Many trainers (bench/trainers.sh)"; sed 's/^/   /' "$OUT/trainers.txt"; fi
  if [ -f "$OUT/base.txt" ]; then echo; echo "10. MNIST against ${BASE_REF:-df35b72}, the last commit before the graph executor (bench/compare.sh)"
    cat "$OUT/base.txt"; fi
  for r in rl-report python-report; do if [ -f "$OUT/$r.txt" ]; then echo; cat "$OUT/$r.txt"; fi; done; } | tee "$OUT/report.txt"
