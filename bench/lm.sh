#!/usr/bin/env bash
# `make bench-lm`: the language model's throughput (ps-train lm) on the
# fortunes corpus at configs/rnn_lm.yaml's sizes (ntoken 10000, ninp = nhid
# = 200, bptt 35, batch 20): tokens/s for psd + 1 and 2 trainers in both
# decoder modes, beside PyTorch's local loop at the same sizes
# (bench/lm_torch.py), with the bytes each window moves (computed from the
# message sizes) and the FLOPs per token.
#   WINDOWS=40 bench/lm.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
CONFIG=configs/rnn_lm.yaml
DATA=${DATA:-data/fortunes}
WINDOWS=${WINDOWS:-40}
V=10000 E=200 H=200 T=35 N=20
PY=/usr/bin/python3
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
scripts/fetch-fortunes.sh "$DATA" >/dev/null
out=$(mktemp -d /tmp/bench-lm.XXXXXX)
echo "== machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
run() {  # mode trainers -> tokens/s of all trainers together
  local mode=$1 k=$2 port=$(( 20000 + RANDOM % 20000 ))
  "$BUILD/bin/psd" --config "$CONFIG" --listen "127.0.0.1:$port" 2>"$out/psd.log" &
  local psd=$! pids=()
  for r in $(seq 1 "$k"); do
    "$BUILD/bin/ps-train" lm --config "$CONFIG" --server "127.0.0.1:$port" --rank "$r" --world-size $((k + 1)) \
      --data "$DATA" --decoder "$mode" --max-batches "$WINDOWS" --log-every 1000 --no-eval >"$out/t$r.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  kill -TERM "$psd"; wait "$psd" || true
  # samples and seconds of each trainer: together, samples over the longest time
  cat "$out"/t*.log | awk '/samples in/ { s += $3; if ($6 > t) t = $6 } END { printf "%.0f", s / t }'
  rm -f "$out"/t*.log
}
flop=$(( 2 * 3 * (4 * H * (E + H) + 4 * H * (H + H) + V * H) ))
echo "FLOPs per token (forward + backward = 3x forward; LSTM 2 layers + decoder): $flop"
# bytes per window (float32 / int64 payloads only)
lstm_w=$(( 4 * (4 * H * (E + H) + 4 * H * (H + H) + 16 * H) ))
common=$(( T * N * 8 + 2 * T * N * E * 4 + 2 * T * N * H * 4 + 2 * lstm_w ))
echo "bytes per window: logits mode $(( common + 2 * T * N * V * 4 + T * N * H * 4 )), fused mode $(( common + T * N * 8 ))" \
     "(ids, embeddings and their gradient, decoder input and its gradient, LSTM weights pulled and gradients pushed; logits and their gradient in logits mode)"
printf "%-28s %12s %14s\n" "configuration" "tokens/s" "GFLOP/s"
for mode in fused logits; do
  for k in 1 2; do
    tps=$(run $mode $k)
    printf "%-28s %12s %14.2f\n" "psd + $k trainer(s), $mode" "$tps" "$(awk -v a="$tps" -v f="$flop" 'BEGIN{print a*f/1e9}')"
  done
done
tl=$($PY bench/lm_torch.py $V $E $H $T $N 10 | sed 's/torch local: \([0-9]*\) .*/\1/')
printf "%-28s %12s %14.2f\n" "PyTorch local loop" "$tl" "$(awk -v a="$tl" -v f="$flop" 'BEGIN{print a*f/1e9}')"
rm -rf "$out"
echo "== the embedding's row-sparse update as the table grows (target: 1M rows >= 90 % of 10k rows' rate)"
"$BUILD/bench/bench_embedding" --secs 3 10000 1000000
