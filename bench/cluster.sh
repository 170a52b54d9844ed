#!/usr/bin/env bash
# `make bench-cluster`: one model on 1, 2 and 3 psd servers on loopback
# (docs/clusters.md). For each layout: the trainers' samples/s
# (MNIST) or tokens/s (the RNN language model), and per server the message
# bytes per batch on its link (psd_message_bytes_total, both directions)
# and the CPU-seconds it spent per batch (/proc/PID/stat utime + stime).
# One 2-vCPU host cannot show a speed-up from more servers - they share the
# same two cores - so the figure to read is the per-server cost: the
# busiest server's CPU-seconds per batch must fall as stages and shards are
# spread (the ratio against the one-server layout is printed). lm_3 and
# lm_3b shard emb over ps0/ps1 at equal rows and at the rows
# scripts/shard-rows.py chooses; the last line compares ps0's share of the
# two emb servers' bytes.
#   BATCHES=60 LM_BATCHES=30 TRAINERS=2 bench/cluster.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BATCHES=${BATCHES:-60}
LM_BATCHES=${LM_BATCHES:-30}
TRAINERS=${TRAINERS:-2}
MNIST=${MNIST:-data/mnist}
LMDATA=${LMDATA:-data/fortunes}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
scripts/fetch-mnist.sh "$MNIST" >/dev/null
scripts/fetch-fortunes.sh "$LMDATA" >/dev/null
out=$(mktemp -d /tmp/bench-cluster.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
hz=$(getconf CLK_TCK)
echo "== machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
msg_bytes() {  # port -> psd_message_bytes_total, received + sent, from one scrape
  local v
  v=$(exec 3<>"/dev/tcp/127.0.0.1/$1" && printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 && cat <&3) || true
  awk '$1 ~ /^psd_message_bytes_total\{/ { s += $2 } END { printf "%.0f", s }' <<<"$v"
}

# layout NAME BASECONFIG "placement flags..." SERVERS  then the trainer command after --
# Writes one row per server: bytes in/out per batch, CPU-s per batch.
layout() {
  local label=$1 cfg=$2 place=$3 n=$4 task=$5 batches=$6; shift 6
  local base=$(( 20000 + RANDOM % 20000 )) yaml="$out/$label.yaml" k
  {
    sed '/^servers:/,/^[^ ]/{/^servers:/d;/^  /d}' "$cfg"
    echo "servers:"
    for k in $(seq 0 $((n - 1))); do
      echo "  ps$k: {address: \"127.0.0.1:$((base + 2 * k))\", metrics_listen: \"127.0.0.1:$((base + 2 * k + 1))\"}"
    done
  } >"$yaml"
  local spids=() mports=() t0=() k2
  for k in $(seq 0 $((n - 1))); do
    mports[$k]=$((base + 2 * k + 1))
    # shellcheck disable=SC2086
    "$BUILD/bin/psd" --config "$yaml" --name "ps$k" $place --set server.checkpoint_dir= 2>"$out/$label-ps$k.log" &
    spids[$k]=$!; pids+=($!)
  done
  for k in $(seq 0 $((n - 1))); do
    for _ in $(seq 100); do grep -q "serving model" "$out/$label-ps$k.log" && break; sleep 0.1; done
    grep -q "serving model" "$out/$label-ps$k.log" || { cat "$out/$label-ps$k.log"; echo "bench-cluster: $label: ps$k did not start"; exit 1; }
  done
  local b0=() c0=()
  for k in $(seq 0 $((n - 1))); do
    b0[$k]=$(msg_bytes "${mports[$k]}")
    c0[$k]=$(cpu_ticks "${spids[$k]}")
  done
  local tp=() r
  for r in $(seq 1 "$TRAINERS"); do
    # shellcheck disable=SC2086
    "$BUILD/bin/ps-train" $task --config "$yaml" $place --rank "$r" --world-size $((TRAINERS + 1)) \
      --max-batches "$batches" --log-every 100000 "$@" >"$out/$label-t$r.log" 2>&1 &
    tp+=($!)
  done
  for p in "${tp[@]}"; do wait "$p" || { tail -n 5 "$out/$label-t"*.log; echo "bench-cluster: $label: a trainer failed"; exit 1; }; done
  local total=$((batches * TRAINERS)) rate
  rate=$(cat "$out/$label"-t*.log | awk '/samples in/ { s += $3; if ($6 > t) t = $6 } END { printf "%.0f", (t > 0 ? s / t : 0) }')
  local worst=0
  for k in $(seq 0 $((n - 1))); do
    local b1 c1 bytes cpu
    b1=$(msg_bytes "${mports[$k]}")
    c1=$(cpu_ticks "${spids[$k]}")
    bytes=$(( (b1 - b0[k]) / total ))
    cpu=$(awk -v a="${c0[$k]}" -v b="$c1" -v hz="$hz" -v n="$total" 'BEGIN { printf "%.4f", (b - a) / hz / n }')
    worst=$(awk -v w="$worst" -v c="$cpu" 'BEGIN { print (c > w) ? c : w }')
    eval "emb_${label}_$k=$bytes"
    printf "  %-10s ps%d  %10d bytes/batch  %8s CPU-s/batch  hosts %s\n" "$label" "$k" "$bytes" "$cpu" \
      "$(sed -n 's/.*: hosts \(.*\)$/\1/p' "$out/$label-ps$k.log" | head -n 1)"
  done
  for k in $(seq 0 $((n - 1))); do kill -TERM "${spids[$k]}"; wait "${spids[$k]}" || true; done
  printf "  %-10s %8s %s/s (%d trainers), busiest server %s CPU-s/batch\n" "$label" "$rate" \
    "$([ "$task" = lm ] && echo tokens || echo samples)" "$TRAINERS" "$worst"
  eval "worst_$label=$worst"
}

echo
echo "== MNIST CNN (the tutorial's two stages): $BATCHES batches x $TRAINERS trainers"
layout mnist_1 configs/cluster-mnist.yaml "--set model.placement.conv=ps0 --set model.placement.fc=ps0" 1 "" "$BATCHES" --data "$MNIST" --no-eval
layout mnist_2 configs/cluster-mnist.yaml "--set model.placement.conv=ps0 --set model.placement.fc=ps1" 2 "" "$BATCHES" --data "$MNIST" --no-eval
echo "  (MNIST has two stages: a third server would host nothing)"
echo
echo "== RNN language model (rnn_lm, ntoken 10000): $LM_BATCHES windows x $TRAINERS trainers, fused decoder"
lmset() { echo "--set model.placement.emb=$1 --set model.placement.decoder=$2 --set model.placement.rnn=$2"; }
layout lm_1 configs/cluster-lm.yaml "$(lmset ps0 ps0)" 1 lm "$LM_BATCHES" --data "$LMDATA" --no-eval
layout lm_2 configs/cluster-lm.yaml "$(lmset ps0 ps1)" 2 lm "$LM_BATCHES" --data "$LMDATA" --no-eval
layout lm_3 configs/cluster-lm.yaml "--set model.placement.emb.shards=ps0,ps1 --set model.placement.decoder=ps2 --set model.placement.rnn=ps2" 3 lm "$LM_BATCHES" --data "$LMDATA" --no-eval
# emb split where scripts/shard-rows.py puts half the training tokens on each shard
lm_rows=$(python3 scripts/shard-rows.py "$LMDATA" 2 10000 2>/dev/null | sed -n 's/^--set model.placement.emb.rows=//p')
layout lm_3b configs/cluster-lm.yaml "--set model.placement.emb.shards=ps0,ps1 --set model.placement.emb.rows=$lm_rows --set model.placement.decoder=ps2 --set model.placement.rnn=ps2" 3 lm "$LM_BATCHES" --data "$LMDATA" --no-eval
echo "  (lm_3: emb split at row 5000 of 10000 (equal rows); lm_3b: at row $lm_rows (equal token shares, shard-rows.py))"
echo
# shellcheck disable=SC2154
echo "busiest server's CPU-s per batch vs one server: MNIST 2 servers $(awk -v a="$worst_mnist_2" -v b="$worst_mnist_1" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }');" \
     "LM 2 servers $(awk -v a="$worst_lm_2" -v b="$worst_lm_1" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'), 3 servers $(awk -v a="$worst_lm_3" -v b="$worst_lm_1" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }') (< 1: the per-server cost falls)"
# shellcheck disable=SC2154
echo "emb shards' bytes per batch, ps0 / (ps0 + ps1): equal rows $(awk -v a="$emb_lm_3_0" -v b="$emb_lm_3_1" 'BEGIN { printf "%.1f %%", (a + b > 0 ? 100 * a / (a + b) : 0) }'), shard-rows.py's rows $(awk -v a="$emb_lm_3b_0" -v b="$emb_lm_3b_1" 'BEGIN { printf "%.1f %%", (a + b > 0 ? 100 * a / (a + b) : 0) }')"
