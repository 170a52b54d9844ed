#!/usr/bin/env bash
# The RL part of `make bench`: the tutorial's REINFORCE agent and observers
# on CartPole-v1, psd + ps-train cartpole vs PyTorch RPC (bench/torch_rl.py,
# the tutorial re-implemented with the same CartPole dynamics), for 2 and 4
# observers over ROUNDS episodes each: environment steps per second of the
# whole system and the median select-action round trip (the observer's
# Forward / rpc_sync to the agent). Prints the lines and the ratio; the
# target is psd >= 5x the tutorial's steps/s with as many observers.
#   ROUNDS=30 OUT=dir bench/rl.sh
# psd runs plain SGD (lr 0.01) so the bench does not depend on the optimizer
# build; the PyTorch side runs the tutorial's Adam(1e-2). Both learn, so
# episode lengths differ; steps/s is per environment step either way.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
ROUNDS=${ROUNDS:-30}
OUT=${OUT:-$(mktemp -d /tmp/bench-rl.XXXXXX)}
PY=/usr/bin/python3
: >"$OUT/rl.txt"
for n in 2 4; do
  port=$(( 20000 + RANDOM % 20000 )); addr="127.0.0.1:$port"
  "$BUILD/bin/psd" --config configs/cartpole.yaml --listen "$addr" --set server.sync_workers=$n \
      --set optimizer.type=sgd --set optimizer.lr=0.01 --log-level warn 2>"$OUT/rl-psd-$n.log" &
  psd=$!
  pids=()
  for r in $(seq 1 $n); do
    "$BUILD/bin/ps-train" cartpole --config configs/cartpole.yaml --server "$addr" --rank "$r" --world-size $((n + 1)) \
        --max-rounds "$ROUNDS" --log-every 1000000 >"$OUT/rl-obs-$n-$r.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  kill -TERM "$psd"; wait "$psd" || true
  # median over the observers of their median round trips
  med=$(grep -ho "median [0-9]*" "$OUT"/rl-obs-$n-*.log | awk '{print $2}' | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
  cat "$OUT"/rl-obs-$n-*.log | awk -v n=$n -v rounds="$ROUNDS" -v med="$med" '
    /samples in/ { s += $3; t = ($6 > t ? $6 : t) }
    END { printf "psd_rl observers=%d rounds=%d env_steps=%d secs=%.2f steps_per_s=%.0f select_action_median_us=%s\n",
                 n, rounds, s, t, s / t, med }' | tee -a "$OUT/rl.txt"
  if [ -z "${SKIP_TORCH:-}" ]; then
    timeout 900 $PY bench/torch_rl.py "$n" "$ROUNDS" 2>/dev/null | grep '^torch_rl' | tee -a "$OUT/rl.txt"
  fi
done
awk '
  { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[$1, kv[1]] = kv[2] } ; side[$1] = 1; obs = v[$1, "observers"];
    sps[$1, obs] = v[$1, "steps_per_s"]; lat[$1, obs] = v[$1, "select_action_median_us"] }
  END {
    print "== RL (CartPole REINFORCE, sync rounds): psd vs the PyTorch RPC tutorial"
    printf "%-10s %14s %14s %8s %16s %16s\n", "observers", "psd steps/s", "torch steps/s", "ratio", "psd select us", "torch select us"
    for (o = 2; o <= 4; o += 2) if (sps["psd_rl", o] != "")
      printf "%-10d %14s %14s %8s %16s %16s\n", o, sps["psd_rl", o], sps["torch_rl", o] == "" ? "-" : sps["torch_rl", o],
             sps["torch_rl", o] == "" ? "-" : sprintf("%.1fx", sps["psd_rl", o] / sps["torch_rl", o]),
             lat["psd_rl", o], lat["torch_rl", o] == "" ? "-" : lat["torch_rl", o]
    print "target: psd >= 5x the tutorial'"'"'s environment steps/s with the same number of observers"
  }' "$OUT/rl.txt" | tee "$OUT/rl-report.txt"
