#!/usr/bin/env bash
# psd's CPU per sample, thread by thread, serving N bench_trainer processes:
# what psd costs beyond the in-process step (bench_compute) for one model.
#
#   bench/psd_cpu.sh MODEL BATCHES [psd flags...] [-- bench_trainer flags...]
#
# MODEL: mnist (configs/local.yaml, batch 32) or resnet (section 7 of
# bench/run.sh: examples/models/small_resnet.yaml, batch 64, the same psd
# settings). BATCHES timed batches per trainer after a 5-batch round (start-
# up, kernels, pools). Environment: N trainers (2), BUILD (build), DATA
# (data/mnist), ISA (ONEDNN_MAX_CPU_ISA for psd, e.g. AVX2, SSE41), LOCAL=1
# for the local transport (server.local_socket; the trainers dial local:PATH),
# BS (the batch size; MNIST 32, ResNet 64), VERBOSE=1 for the per-thread table, PHASES=1 for psd's per-call phase
# times (psd_call_phase_seconds_total, us per batch), PSD_LOG=FILE to keep
# psd's log (stderr; e.g. what PS_EXEC_PROFILE or a debug build prints),
# CALLS=1 for the split of psd's CPU below (calls_us, busy; EXEC_KEEP=FILE
# keeps PS_EXEC_PROFILE's node-by-node lines). One line:
#
#   psd_us=<psd CPU us/sample> workers_us=<the 4 busiest threads'>
#   other_us=<the rest: gRPC's threads, OpenMP teams> trainers_us=<their CPU>
#   e2e=<samples/s of all trainers> faults_per_batch=<minor faults> cs_per_batch=<switches>
#   wait_ms_per_batch=<psd's threads' time runnable but waiting for a CPU (schedstat)>
#   [CALLS=1: calls_us=<CPU of psd's forward and backward compute calls per
#   sample, on the calling thread (PS_EXEC_PROFILE; warm-up calls in, a
#   stage's first 10 left out): what bench_compute's cpu forward +
#   backward is in-process> calls_wall_us=<the same calls' wall time per
#   sample: CPU + waits for a core> fwd_ms=<a batch's forward CPU/wall ms,
#   stages summed> bwd_ms=<the backward's> busy=<CPUs busy over the timed batches: e2e x
#   (psd_us + trainers_us); 2 is both cores, the rest idle or another's>]
#
# Compare with `bench_compute --model ... --threads 1 --batch B` cpu_us (the
# in-process step), run alternately with this (load moves both).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DATA=${DATA:-data/mnist}
N=${N:-2}
[ $# -ge 2 ] || { sed -n '2,20p' "$0"; exit 2; }
model=$1 batches=$2
shift 2
pflags=() tflags=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do pflags+=("$1"); shift; done
[ $# -gt 0 ] && shift
tflags=("$@")
dir=$(mktemp -d)
psd=
trap '[ -n "$psd" ] && kill "$psd" 2>/dev/null; rm -rf "$dir"' EXIT  # a trainer that fails must not leave psd running
case $model in
  mnist) config=configs/local.yaml; bs=32 loss=nll ;;
  resnet)
    bs=64 loss=ce  # logits out: the cross-entropy's gradient (bench_trainer --loss)
    config=$dir/psd.yaml
    cat >"$config" <<EOF
server: {threads: 4, compute_threads: 0, context_ttl_s: 120, max_message_mb: 64, consistency: hogwild}
model: {file: $PWD/examples/models/small_resnet.yaml, seed: 1, backend: dnnl}
optimizer: {type: sgd, lr: 0.03, momentum: 0, weight_decay: 0}
EOF
    ;;
  *) echo "psd_cpu.sh: MODEL is mnist or resnet, not '$model'" >&2; exit 2 ;;
esac
bs=${BS:-$bs}   # BS=N: another batch size (per-call against per-sample costs)
. bench/lib.sh
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
port=$(bench_port)
target=127.0.0.1:$port
if [ -n "${LOCAL:-}" ]; then
  pflags+=(--set "server.local_socket=$dir/psd.sock")
  target=local:$dir/psd.sock
fi
(
  [ -n "${ISA:-}" ] && export ONEDNN_MAX_CPU_ISA=$ISA
  [ -n "${CALLS:-}" ] && export PS_EXEC_PROFILE=$dir/exec
  exec "$BUILD/bin/psd" --config "$config" --listen "127.0.0.1:$port" --metrics-listen "127.0.0.1:$((port + 1))" \
    ${pflags[@]+"${pflags[@]}"} 2>"${PSD_LOG:-$dir/psd.log}"
) &
psd=$!
wait_psd "127.0.0.1:$((port + 1))"
trainers() {  # batches, extra flags...
  local b=$1 pids=() r
  shift
  for r in $(seq 1 "$N"); do
    "$BUILD/bench/bench_trainer" --server "$target" --rank "$r" --batches "$b" --warmup 0 --batch-size "$bs" --loss "$loss" \
      --data "$DATA" "$@" ${tflags[@]+"${tflags[@]}"} >/dev/null &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r"; done
}
snap() {  # tid comm utime stime voluntary nonvoluntary minflt, per thread
  local t
  for t in /proc/"$psd"/task/*; do
    echo "$(basename "$t") $(tr ' ' _ <"$t/comm") $(cut -d' ' -f14,15 "$t/stat")" \
      "$(awk '/^(voluntary|nonvoluntary)_ctxt/ {printf "%s ", $2}' "$t/status")$(cut -d' ' -f10 "$t/stat") $(cut -d' ' -f2 "$t/schedstat")"
  done | sort
}
metrics() { curl -sf "http://127.0.0.1:$((port + 1))/metrics" | grep '^psd_call_phase_seconds_total' | sort || true; }
trainers 5
psnap() { cut -d' ' -f10,14,15 /proc/"$psd"/stat; }  # minflt utime stime of the process: its ended threads too
snap >"$dir/s0"; psnap >"$dir/p0"; metrics >"$dir/m0"
mkdir "$dir/ready"
trainers "$batches" --start-together "$dir/ready" "$N" --out "$dir/t"
snap >"$dir/s1"; psnap >"$dir/p1"; metrics >"$dir/m1"
kill -TERM "$psd"; wait "$psd" || true
# bench_trainer --out appends one "trainer ..." line per process
span_cpu=$(awk '/^trainer/ {for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
  if (s == "" || v["t_start"] < s) s = v["t_start"]; if (v["t_end"] > e) e = v["t_end"]; c += v["cpu_s"] }
  END {printf "%.6f %.6f", e - s, c}' "$dir/t")
if [ -n "${PHASES:-}" ]; then
  join "$dir/m0" "$dir/m1" | awk -v nb=$((N * batches)) '{d = $3 - $2; if (d > 0) printf "  %s %.1f us/batch\n", $1, d * 1e6 / nb}' \
    | sed 's/psd_call_phase_seconds_total//'
fi
# CALLS: the (call) lines' mean CPU per call, forward and backward of every stage, per sample
calls=
if [ -n "${CALLS:-}" ]; then
  calls=$(awk -v bs=$bs '/node=\(call\)/ {for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    c += v["cpu_us"]; w += v["wall_us"]; d[v["dir"]] += v["cpu_us"]; dw[v["dir"]] += v["wall_us"]}
    END {printf "%.1f calls_wall_us=%.1f fwd_ms=%.2f/%.2f bwd_ms=%.2f/%.2f", c / bs, w / bs,
      d["fwd"] / 1e3, dw["fwd"] / 1e3, d["bwd"] / 1e3, dw["bwd"] / 1e3}' "$dir/exec")
  [ -n "${EXEC_KEEP:-}" ] && cp "$dir/exec" "$EXEC_KEEP"
fi
# psd's CPU and faults from the process's totals (a local transport connection's thread
# ends with its trainer: only the totals keep it); the per-thread table for the rest
ptot=$(paste "$dir/p0" "$dir/p1" | awk '{print ($5 + $6 - $2 - $3), ($4 - $1)}')
join "$dir/s0" "$dir/s1" | awk -v V="${VERBOSE:-}" -v n=$((N * batches * bs)) -v nb=$((N * batches)) \
  -v tck="$(getconf CLK_TCK)" -v sc="$span_cpu" -v calls="$calls" -v ptot="$ptot" '
  { u = $10 - $3; s = $11 - $4; c[NR] = u + s; tot += u + s; f += $14 - $7; wt += $15 - $8; cs += $12 - $5 + $13 - $6
    if (V && u + s) printf "  %-8s %-16s utime %5d stime %5d ticks, switches %6d + %6d, minflt %d\n", $1, $2, u, s, $11 - $5, $12 - $6, $13 - $7 }
  END {
    for (i = 1; i <= NR; i++) for (j = i + 1; j <= NR; j++) if (c[j] > c[i]) { t = c[i]; c[i] = c[j]; c[j] = t }
    w = c[1] + c[2] + c[3] + c[4]; split(sc, a, " "); split(ptot, p, " "); tot = p[1]; f = p[2]
    printf "psd_us=%.1f workers_us=%.1f other_us=%.1f trainers_us=%.1f e2e=%.0f faults_per_batch=%.1f cs_per_batch=%.1f wait_ms_per_batch=%.2f\n",
      tot / tck / n * 1e6, w / tck / n * 1e6, (tot - w) / tck / n * 1e6, a[2] / n * 1e6, n / a[1], f / nb, cs / nb, wt / nb / 1e6
    if (calls != "") printf "calls_us=%s busy=%.2f\n", calls, (tot / tck + a[2]) / a[1] }'
