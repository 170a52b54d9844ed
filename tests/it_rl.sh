#!/usr/bin/env bash
# Integration: the cartpole task (ps-train cartpole) against psd in sync
# rounds, with plain SGD so it does not depend on the optimizer:
#  1. smoke: 2 observers x 6 episodes (at most 40 steps each): every episode
#     is one round of both observers and exactly one optimizer step (model
#     version 6, metrics rounds 6, each with 2 reward values), the loss is
#     finite, Status, `ps-train status` and /metrics report the rounds'
#     scalars, and each round's reward stats match the observers' own
#     episode lengths;
#  2. the stop threshold: with server.stop_threshold 0 the first round
#     solves it and both observers stop after one episode;
#  3. a killed observer does not hang the rounds: with sync_timeout_s 2,
#     observer 2 is killed (SIGKILL); observer 1's rounds close after the
#     timeout with 1 member and go on; a restarted observer 2 rejoins and
#     rounds have 2 members again.
. "$(dirname "$0")/lib.sh" it_rl

start_psd() {  # name, extra args... ; sets addr, maddr, psd_pid
  local name=$1; shift
  local port=$(free_port) mport=$(free_port)
  addr="127.0.0.1:$port"; maddr="127.0.0.1:$mport"
  "$BUILD/bin/psd" --config configs/cartpole.yaml --listen "$addr" --metrics-listen "$maddr" \
      --set optimizer.type=sgd --set optimizer.lr=0.01 "$@" 2>"$tmp/psd-$name.log" &
  psd_pid=$!
  pids+=($psd_pid)
}
observer() {  # name rank extra... (background); sets obs_pid
  local name=$1 rank=$2; shift 2
  "$BUILD/bin/ps-train" cartpole --config configs/cartpole.yaml --server "$addr" --rank "$rank" --log-every 1 \
      "$@" >"$tmp/$name.log" 2>&1 &
  obs_pid=$!
  pids+=($obs_pid)
}
stop_psd() { kill -TERM "$psd_pid"; wait "$psd_pid" || fail "psd did not stop cleanly"; }

# ---- 1. smoke
start_psd smoke --set server.sync_timeout_s=60
observer smoke1 1 --max-rounds 6 --episode-steps 40; o1=$obs_pid
observer smoke2 2 --max-rounds 6 --episode-steps 40; o2=$obs_pid
wait "$o1" || fail "observer 1 failed"
wait "$o2" || fail "observer 2 failed"
for r in 1 2; do
  n=$(grep -c "Episode" "$tmp/smoke$r.log" || true)
  [ "$n" = 6 ] || fail "observer $r printed $n episode lines, expected 6"
  grep "Episode" "$tmp/smoke$r.log" | grep -q "of 2 observers" || fail "observer $r: rounds without 2 observers"
  grep "Episode" "$tmp/smoke$r.log" | grep -vq "of 2 observers" && fail "observer $r: a round without both observers"
  grep -Eq "loss (nan|-?inf)" "$tmp/smoke$r.log" && fail "observer $r: non-finite loss"
  rounds=$(grep "Episode" "$tmp/smoke$r.log" | grep -o "round [0-9][0-9]*" | awk '{print $2}' | tr '\n' ' ')
  [ "$rounds" = "1 2 3 4 5 6 " ] || fail "observer $r: rounds '$rounds', expected 1..6"
done
# each round's min reward is the smaller of the two observers' episode lengths
paste <(grep -o "own [0-9]*" "$tmp/smoke1.log" | awk '{print $2}') <(grep -o "own [0-9]*" "$tmp/smoke2.log" | awk '{print $2}') \
      <(grep -o "Last reward: [0-9.]*" "$tmp/smoke1.log" | awk '{print $3}') |
  awk '{m = $1 < $2 ? $1 : $2; if (m != $3 + 0) { print "round " NR ": min(" $1 "," $2 ") != " $3; bad = 1 } } END { exit bad }' ||
  fail "the rounds' min reward is not the observers' smaller episode"
st=$("$BUILD/bin/ps-train" status --server "$addr") || fail "ps-train status"
<<<"$st" grep -q "version 6 (optimizer steps applied)" || fail "model version after 6 rounds: $st"
<<<"$st" grep -q "metrics round     6 (not solved" || fail "status metrics round: $st"
<<<"$st" grep -Eq "reward +count 2 " || fail "status reward scalar: $st"
m=$(curl -sf "http://$maddr/metrics") || fail "/metrics"
<<<"$m" grep -q '^psd_metrics_rounds_total 6$' || fail "/metrics: psd_metrics_rounds_total"
<<<"$m" grep -q '^psd_round_scalar{name="reward",stat="count"} 2$' || fail "/metrics: reward count"
<<<"$m" grep -q '^psd_round_scalar{name="loss",stat="mean"} ' || fail "/metrics: loss mean"
<<<"$m" grep -q '^psd_solved{metric="reward"} 0$' || fail "/metrics: psd_solved"
stop_psd

# ---- 2. stop threshold
start_psd stop --set server.sync_timeout_s=60 --set server.stop_threshold=0
observer stop1 1 --max-rounds 50 --episode-steps 40; o1=$obs_pid
observer stop2 2 --max-rounds 50 --episode-steps 40; o2=$obs_pid
wait "$o1" || fail "observer 1 failed"
wait "$o2" || fail "observer 2 failed"
for r in 1 2; do
  grep -q "Solved! Running reward is now" "$tmp/stop$r.log" || fail "observer $r did not stop solved"
  n=$(grep -c "Episode" "$tmp/stop$r.log" || true)
  [ "$n" = 1 ] || fail "observer $r ran $n episodes after psd said solved"
done
grep -q "Solved! Running reward is now" "$tmp/psd-stop.log" || fail "psd did not log Solved"
stop_psd

# ---- 3. killed observer
start_psd kill --set server.sync_timeout_s=2
observer kill1 1 --max-rounds 100000 --episode-steps 20; o1=$obs_pid
observer kill2 2 --max-rounds 100000 --episode-steps 20; o2=$obs_pid
wait_for() {  # file pattern count seconds
  local i; for i in $(seq 1 $(( $4 * 10 ))); do
    [ "$(grep -c "$2" "$1" 2>/dev/null || true)" -ge "$3" ] && return 0; sleep 0.1
  done; return 1
}
wait_for "$tmp/kill1.log" "of 2 observers" 5 60 || fail "no rounds of 2 observers"
kill -9 "$o2"; wait "$o2" 2>/dev/null || true
# observer 1 goes on: rounds of 1 member after the timeout
wait_for "$tmp/kill1.log" "of 1 observers" 3 60 || fail "observer 1 stalled after observer 2 died"
kill -0 "$o1" || fail "observer 1 exited"
before=$(grep -c "of 2 observers" "$tmp/kill1.log")
observer kill2b 2 --max-rounds 100000 --episode-steps 20; o2=$obs_pid
wait_for "$tmp/kill1.log" "of 2 observers" $(( before + 3 )) 60 || fail "restarted observer 2 did not rejoin"
m=$(curl -sf "http://$maddr/metrics") || fail "/metrics"
to=$(echo "$m" | awk '/^psd_sync_timeouts_total/ {print $2}')
[ "${to:-0}" -ge 1 ] || fail "no round closed by the timeout"
kill -TERM "$o1" "$o2" 2>/dev/null || true
wait "$o1" 2>/dev/null || true; wait "$o2" 2>/dev/null || true
stop_psd
echo "it_rl: cartpole smoke (6 rounds, one step each), stop threshold, killed observer dropped and rejoined: OK"
