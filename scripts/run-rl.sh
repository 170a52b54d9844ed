#!/usr/bin/env bash
# The tutorial's REINFORCE agent on one machine: psd hosts the CartPole
# policy and its optimizer (configs/cartpole.yaml: Adam 1e-2, sync rounds of
# 2 observers, gradients summed), two `ps-train cartpole` observers play
# their episodes through it, print the tutorial's lines and stop when psd
# says the running reward passed 475; psd is stopped cleanly. `make run-rl`.
#   CONFIG=configs/cartpole.yaml OBSERVERS=2 SEED=543 scripts/run-rl.sh [extra ps-train flags]
# PSD_FLAGS adds psd options (e.g. "--set optimizer.lr=0.005").
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
CONFIG=${CONFIG:-configs/cartpole.yaml}
OBSERVERS=${OBSERVERS:-2}
SEED=${SEED:-543}
PORT=${PORT:-$(( 20000 + RANDOM % 20000 ))}
addr="127.0.0.1:$PORT"
logdir=$(mktemp -d /tmp/psd-rl.XXXXXX)

. scripts/local-cluster.sh
# shellcheck disable=SC2086
psd_start "$CONFIG" --listen "$addr" --set server.sync_workers="$OBSERVERS" ${PSD_FLAGS:-}
status=0
workers_run "$OBSERVERS" observer "$BUILD/bin/ps-train" cartpole --config "$CONFIG" --server "$addr" \
  --seed "$SEED" "$@" || status=1
psd_status=0
psd_stop || psd_status=$?
echo
echo "== summary"
for r in $(seq 1 "$OBSERVERS"); do
  grep -h "Solved!\|greedy policy\|samples in" "$logdir/observer$r.log" || { echo "Observer $r failed:"; tail -n 5 "$logdir/observer$r.log"; }
done
grep -h "Solved!" "$logdir/psd.log" || echo "psd: not solved within the rounds run"
if [ "$psd_status" -ne 0 ]; then echo "psd exited with status $psd_status"; status=1; fi
exit $status
