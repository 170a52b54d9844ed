#!/usr/bin/env bash
# The main job on one machine: start psd on loopback, train with two
# concurrent ps-train processes (ranks 1 and 2), print each trainer's
# accuracy, stop psd cleanly. Used by `make run`.
#   CONFIG=configs/local.yaml EPOCHS=1 TRAINERS=2 scripts/run-local.sh [extra ps-train flags]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
CONFIG=${CONFIG:-configs/local.yaml}
TRAINERS=${TRAINERS:-2}
EPOCHS=${EPOCHS:-1}
DATA=${DATA:-data/mnist}
logdir=$(mktemp -d /tmp/psd-run.XXXXXX)

. scripts/local-cluster.sh
psd_start "$CONFIG"
status=0
workers_run "$TRAINERS" trainer "$BUILD/bin/ps-train" --config "$CONFIG" --data "$DATA" --epochs "$EPOCHS" "$@" ||
  status=1
psd_status=0
psd_stop || psd_status=$?
echo
echo "== summary"
for r in $(seq 1 "$TRAINERS"); do
  grep -h "accuracy" "$logdir/trainer$r.log" || { echo "Rank $r failed:"; tail -n 5 "$logdir/trainer$r.log"; }
done
tail -n 2 "$logdir/psd.log"
if [ "$psd_status" -ne 0 ]; then echo "psd exited with status $psd_status"; status=1; fi
exit $status
