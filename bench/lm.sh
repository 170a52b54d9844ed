#!/usr/bin/env bash
# `make bench-lm`: the language model's throughput (ps-train lm) on the
# fortunes corpus at configs/rnn_lm.yaml's sizes (ntoken 10000, ninp = nhid
# = 200, bptt 35, batch 20): tokens/s for psd + 1 and 2 trainers in both
# decoder modes, beside the PyTorch RPC tutorial's design with 1 and 2
# trainers (bench/lm_rpc.py) and PyTorch's local loop (bench/lm_torch.py) at
# the same sizes, with the bytes each window moves (computed from the
# message sizes), the FLOPs per token, the CPU's measured FMA peak
# (bench/fma_peak.c) and the targets' ratios (fused >= 10x the tutorial's
# tokens/s; >= 50 % of the FMA peak); then the embedding bench and the
# quality comparison with PyTorch's RNNModel over 3 seeds
# (bench/lm_quality.sh, ~15 min at LM_STEPS=100; LM_QUALITY=0 skips it).
# Beside each psd configuration, the CPU per token of psd (while the trainers
# ran) and of the trainers (their training loops): figures load disturbs
# less than tokens/s; and the time psd's calls waited for the weights locks
# (its phase counters): per Step, and over all calls per token. The fused mode also runs with oneDNN capped to AVX2
# and SSE4.1 (LM_ISAS, "" skips), each against its own ISA's FMA peak.
#   WINDOWS=40 RPC_WINDOWS=8 LM_STEPS=100 bench/lm.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
CONFIG=configs/rnn_lm.yaml
DATA=${DATA:-data/fortunes}
WINDOWS=${WINDOWS:-40}
RPC_WINDOWS=${RPC_WINDOWS:-8}   # the tutorial's design runs ~2.5 s a window here
V=10000 E=200 H=200 T=35 N=20
PY=/usr/bin/python3
. bench/lib.sh
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
scripts/fetch-fortunes.sh "$DATA" >/dev/null
out=$(mktemp -d /tmp/bench-lm.XXXXXX)
echo "== machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
run() {  # mode trainers -> tokens/s of all trainers together (bench/lib.sh)
  lm_tokens "$1" "$2" "$WINDOWS" "$DATA" "$out"
}
flop=$(lm_flop_per_token)
echo "FLOPs per token (forward + backward = 3x forward; LSTM 2 layers + decoder): $flop"
# bytes per window (float32 / int64 payloads only)
lstm_w=$(( 4 * (4 * H * (E + H) + 4 * H * (H + H) + 16 * H) ))
common=$(( T * N * 8 + 2 * T * N * E * 4 + 2 * T * N * H * 4 + 2 * lstm_w ))
echo "bytes per window: logits mode $(( common + 2 * T * N * V * 4 + T * N * H * 4 )), fused mode $(( common + T * N * 8 ))" \
     "(ids, embeddings and their gradient, decoder input and its gradient, LSTM weights pulled and gradients pushed; logits and their gradient in logits mode)"
# the CPU's FP32 FMA peak, measured (bench/fma_peak.c, the vector width of oneDNN's ISA)
fma=$("$BUILD/bench/fma_peak")
echo "$fma"
# the peak: the best single core x the CPUs (lscpu: 1 thread per core); the
# CPUs measured together are printed beside (lower when other jobs run)
peak=$(echo "$fma" | sed 's/.*CPUs) \([0-9.]*\) GFLOP.*/\1/')
peak_all=$(echo "$fma" | sed 's/.*together \([0-9.]*\) GFLOP.*/\1/')
cpu_of() {  # mode trainers [dir] -> psd's and the trainers' CPU us per token, psd's lock waits (bench/lib.sh lm_tokens)
  local d=${3:-$out}
  printf "%s   %s" "$(sed 's/psd_us_tok=\([0-9.]*\) trainer_us_tok=\([0-9.]*\)/\1, \2/' "$d/cpu-$1-$2.txt" 2>/dev/null || echo "?")" \
    "$(sed 's/step_lock_ms=\([0-9.]*\) lock_us_tok=\([0-9.]*\)/\1 ms, \2 us/' "$d/lock-$1-$2.txt" 2>/dev/null || echo "?")"
}
row() {  # name tokens/s
  printf "%-32s %10s %10.2f %10.1f %%\n" "$1" "$2" "$(awk -v a="$2" -v f="$flop" 'BEGIN{print a*f/1e9}')" \
    "$(awk -v a="$2" -v f="$flop" -v p="$peak" 'BEGIN{print 100*a*f/1e9/p}')"
}
printf "%-32s %10s %10s %12s   %s   %s\n" "configuration" "tokens/s" "GFLOP/s" "% of peak" "CPU us/token: psd, trainers" \
  "psd's lock wait: per Step, per token"
declare -A tps
for mode in fused logits; do
  for k in 1 2; do
    tps[$mode$k]=$(run $mode $k)
    echo "$(row "psd + $k trainer(s), $mode" "${tps[$mode$k]}")   $(cpu_of "$mode" "$k")"
  done
done
for k in 1 2; do
  tps[rpc$k]=$($PY bench/lm_rpc.py $k $V $E $H $T $N "$RPC_WINDOWS" 2>/dev/null | sed -n 's/torch rpc: \([0-9]*\) .*/\1/p')
  [ -n "${tps[rpc$k]}" ] || { echo "lm.sh: the tutorial's RPC design failed ($k trainers): bench/lm_rpc.py $k $V $E $H $T $N 2" >&2; exit 1; }
  row "PyTorch RPC tutorial, $k trainer(s)" "${tps[rpc$k]}"
done
tl=$($PY bench/lm_torch.py $V $E $H $T $N 10 | sed 's/torch local: \([0-9]*\) .*/\1/')
row "PyTorch local loop" "$tl"
# the fused mode per ISA below the host's (oneDNN capped; the trainers' LSTM
# and psd's decoder both follow it), each against its own ISA's FMA peak;
# LM_ISAS="" skips
for isa in ${LM_ISAS-AVX2 SSE41}; do
  f=$(ONEDNN_MAX_CPU_ISA=$isa "$BUILD/bench/fma_peak")
  p=$(echo "$f" | sed 's/.*CPUs) \([0-9.]*\) GFLOP.*/\1/')
  t=$(ONEDNN_MAX_CPU_ISA=$isa lm_tokens fused 2 "$WINDOWS" "$DATA" "$out/$isa")
  awk -v a="$t" -v f="$flop" -v p="$p" -v isa="$isa" -v c="$(cpu_of fused 2 "$out/$isa")" \
    'BEGIN { g = a * f / 1e9; printf "%-32s %10s %10.2f %10.1f %%   %s   (peak %.1f GFLOP/s)\n", "psd + 2, fused, ONEDNN_MAX_CPU_ISA=" isa, a, g, 100 * g / p, c, p }'
done
rm -rf "$out"
echo "== targets"
for k in 1 2; do
  awk -v a="${tps[fused$k]}" -v b="${tps[rpc$k]}" -v k="$k" 'BEGIN { r = a / b
    printf "fused / the tutorial'"'"'s design, %d trainer(s): %.1fx (target >= 10x): %s\n", k, r, (r >= 10 ? "met" : "NOT met") }'
done
best=$(printf "%s\n" "${tps[fused1]}" "${tps[fused2]}" | sort -n | tail -1)
awk -v a="$best" -v f="$flop" -v p="$peak" -v pa="$peak_all" 'BEGIN { g = a * f / 1e9
  printf "best fused rate %.1f GFLOP/s = %.1f %% of the FMA peak %.1f GFLOP/s (per core x CPUs; target >= 50 %%, issue 22): %s;", g, 100 * g / p, p, (g >= 0.5 * p ? "met" : "NOT met")
  printf " %.1f %% of the CPUs'"'"' rate measured together now (%.1f GFLOP/s)\n", 100 * g / pa, pa }'
echo "== the embedding's row-sparse update as the table grows (target: 1M rows >= 90 % of 10k rows' rate)"
"$BUILD/bench/bench_embedding" --secs 3 10000 1000000
if [ "${LM_QUALITY:-1}" != 0 ]; then
  BUILD=$BUILD DATA=$DATA bench/lm_quality.sh
fi
