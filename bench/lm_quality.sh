#!/usr/bin/env bash
# The language model's quality anchor (run by `make bench-lm`): for each of
# SEEDS, psd (rnn_lm) + 1 ps-train lm (fused decoder) trains STEPS windows
# on the fortunes corpus and prints its test perplexity; PyTorch's
# word_language_model-style RNNModel (bench/lm_torch_train.py) trains the
# same STEPS windows with the same hyper-parameters and seed number on one
# process. Prints both, their means over the seeds and the ratio
# (target: psd's mean within 10 % of PyTorch's).
#
# PyTorch trains at ~380 tokens/s on the 2-core CI machine and evaluates the
# 30k-token test split in ~30 s, so STEPS=100 (70k tokens) takes ~4 min per
# seed and the default three seeds ~15 min (measured 14.5 beside other jobs). Fewer steps are quicker but
# compare noisier, earlier models.
# LM_STEPS=epoch trains one whole epoch each (773 windows of the fortunes
# corpus, as `make run-lm`): ps-train takes ~2-3 min a seed here, PyTorch on
# this CPU about an hour, so run PyTorch where it is fast - the same script
# with LM_TORCH_DEVICE=cuda on a GPU machine (bench/lm_torch_train.py) - and
# give its perplexities here as LM_TORCH_PPL="p1 p2 p3" (one per seed, in
# order; printed as measured elsewhere).
#   LM_STEPS=100 LM_SEEDS="1 2 3" bench/lm_quality.sh
#   LM_STEPS=epoch LM_TORCH_PPL="140.22 135.89 142.97" bench/lm_quality.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
CONFIG=configs/rnn_lm.yaml
DATA=${DATA:-data/fortunes}
STEPS=${LM_STEPS:-100}
SEEDS=${LM_SEEDS:-1 2 3}
PY=/usr/bin/python3
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
scripts/fetch-fortunes.sh "$DATA" >/dev/null
out=$(mktemp -d /tmp/bench-lmq.XXXXXX)
trap 'rm -rf "$out"' EXIT
TORCH_PPL=(${LM_TORCH_PPL:-})
max=(--max-batches "$STEPS")
[ "$STEPS" = epoch ] && max=(--epochs 1)
echo "== quality: $STEPS windows (bptt 35 x batch 20) on one trainer, seeds $SEEDS; load $(cut -d' ' -f1-3 /proc/loadavg)"
[ ${#TORCH_PPL[@]} -gt 0 ] && echo "   PyTorch's perplexities measured elsewhere (LM_TORCH_PPL): ${TORCH_PPL[*]}"
printf "%-6s %14s %14s\n" "seed" "psd test ppl" "torch test ppl"
ps_sum=0 pt_sum=0 n=0
for s in $SEEDS; do
  port=$(( 20000 + RANDOM % 20000 ))
  "$BUILD/bin/psd" --config "$CONFIG" --listen "127.0.0.1:$port" --set model.seed="$s" 2>"$out/psd.log" &
  psd=$!
  if ! "$BUILD/bin/ps-train" lm --config "$CONFIG" --server "127.0.0.1:$port" --rank 1 --world-size 2 \
      --data "$DATA" "${max[@]}" --log-every 1000 --set trainer.seed="$s" >"$out/t.log" 2>&1; then
    kill -TERM "$psd"; wait "$psd" || true
    echo "lm_quality: ps-train lm failed (seed $s):" >&2; tail -5 "$out/t.log" >&2; exit 1
  fi
  kill -TERM "$psd"; wait "$psd" || true
  ps=$(awk '/End of training/ { for (i = 1; i <= NF; i++) if ($i == "test" && $(i+1) == "ppl") { print $(i+2); exit } }' "$out/t.log")
  [ -n "$ps" ] || { echo "lm_quality: no test ppl in ps-train's output (seed $s)" >&2; tail -5 "$out/t.log" >&2; exit 1; }
  if [ ${#TORCH_PPL[@]} -gt 0 ]; then
    pt=${TORCH_PPL[$n]:?LM_TORCH_PPL has fewer values than LM_SEEDS}
  else
    pt=$($PY bench/lm_torch_train.py "$DATA" "$STEPS" "$s" | awk '{ for (i = 1; i <= NF; i++) if ($i == "ppl") print $(i+1) }')
  fi
  printf "%-6s %14.2f %14.2f\n" "$s" "$ps" "$pt"
  ps_sum=$(awk -v a="$ps_sum" -v b="$ps" 'BEGIN{print a+b}')
  pt_sum=$(awk -v a="$pt_sum" -v b="$pt" 'BEGIN{print a+b}')
  n=$((n + 1))
done
awk -v a="$ps_sum" -v b="$pt_sum" -v n="$n" 'BEGIN {
  r = a / b
  printf "%-6s %14.2f %14.2f\n", "mean", a / n, b / n
  printf "psd / PyTorch test perplexity: %.3f (target: within 10 %%, 0.90-1.10): %s\n", r, (r >= 0.9 && r <= 1.1) ? "met" : "NOT met"
}'
