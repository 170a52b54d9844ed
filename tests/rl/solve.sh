#!/usr/bin/env bash
# `make test-rl`: psd + 2 observers (configs/cartpole.yaml: Adam 1e-2, sync
# rounds of 2, gradients summed, per-observer returns normalised per
# episode) must solve CartPole-v1 - psd's running reward (EMA 0.05 of each
# round's minimum episode reward) above 475 - within MAX_ROUNDS (2000)
# rounds on at least NEED (3) of the seeds RL_SEEDS (1 2 3 4 5). Each seed
# sets the weight initialisation (model.seed) and the observers'
# environments and action sampling (trainer.seed). Prints rounds-to-solve,
# or the final running reward, per seed. Extra psd flags: PSD_FLAGS; extra
# observer flags: OBS_FLAGS (e.g. "--entropy 0.01").
. "$(dirname "$0")/../lib.sh" test_rl
set +e
RL_SEEDS=${RL_SEEDS:-1 2 3 4 5}
MAX_ROUNDS=${MAX_ROUNDS:-2000}
NEED=${NEED:-3}
solved=0 total=0
printf "%-6s %-10s %-16s %s\n" seed result rounds "running reward / wall time"
for seed in $RL_SEEDS; do
  total=$((total + 1))
  port=$(free_port); addr="127.0.0.1:$port"
  t0=$(date +%s)
  # shellcheck disable=SC2086
  "$BUILD/bin/psd" --config configs/cartpole.yaml --listen "$addr" --set model.seed="$seed" ${PSD_FLAGS:-} \
      2>"$tmp/psd.$seed.log" &
  psd=$!
  obs=()
  for r in 1 2; do
    # shellcheck disable=SC2086
    "$BUILD/bin/ps-train" cartpole --config configs/cartpole.yaml --server "$addr" --rank "$r" --seed "$seed" \
        --max-rounds "$MAX_ROUNDS" --log-every 100 ${OBS_FLAGS:-} >"$tmp/obs.$seed.$r.log" 2>&1 &
    obs+=($!)
  done
  ok=1
  for p in "${obs[@]}"; do wait "$p" || ok=0; done
  kill -TERM "$psd" 2>/dev/null; wait "$psd" 2>/dev/null
  secs=$(( $(date +%s) - t0 ))
  if [ $ok = 0 ]; then
    printf "%-6s %-10s %-16s %s\n" "$seed" ERROR - "$(tail -n 1 "$tmp/obs.$seed.1.log")"
    continue
  fi
  line=$(grep -h "Solved!" "$tmp/obs.$seed.1.log" | head -n 1)
  if [ -n "$line" ]; then
    solved=$((solved + 1))
    rounds=$(echo "$line" | sed -n 's/.*(round \([0-9]*\),.*/\1/p')
    running=$(echo "$line" | sed -n 's/.*is now \([0-9.]*\).*/\1/p')
    printf "%-6s %-10s %-16s %s\n" "$seed" solved "$rounds" "$running / ${secs}s"
  else
    last=$(grep -h "Average reward" "$tmp/obs.$seed.1.log" | tail -n 1 | sed -n 's/.*Average reward: \([0-9.]*\).*/\1/p')
    printf "%-6s %-10s %-16s %s\n" "$seed" "not solved" ">$MAX_ROUNDS" "${last:-?} / ${secs}s"
  fi
done
echo "test-rl: solved on $solved of $total seeds (need $NEED; logs in $tmp)"
[ "$solved" -ge "$NEED" ]
