#!/usr/bin/env bash
# bench/batching.sh - batched training Forwards (server.batch_wait_ms, issue 22
# item 4) on and off: bench/trainers.sh twice, the same trainer counts, psd
# started with server.threads raised so that every trainer's Forward can be
# held at once (a held Forward keeps its handler thread), first without
# batching, then with it. For information on CPU (one bigger forward is not
# cheaper per sample there; the target is a GPU's launches); the same
# script on a lent GPU with model.placement on cuda:0 is the GPU figure.
#
#   bench/batching.sh                          4 and 8 trainers, 3 rounds each
#   TRAINERS="8 16" WAIT_MS=2 bench/batching.sh
#   PLACE="--set model.placement.conv=cuda:0 --set model.placement.fc=cuda:0" bench/batching.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-$BUILD/bench-results/batching-$(date +%Y%m%d-%H%M%S)}
export TRAINERS=${TRAINERS:-4 8} RUNS=${RUNS:-3} BUILD
WAIT_MS=${WAIT_MS:-2}
max=0
for n in $TRAINERS; do [ "$n" -gt "$max" ] && max=$n; done
threads=$(( max + 2 )); [ "$threads" -gt 64 ] && threads=64
for mode in off on; do
  wait=0; [ "$mode" = on ] && wait=$WAIT_MS
  echo "== batched Forwards $mode (server.batch_wait_ms=$wait, server.threads=$threads)"
  OUT="$OUT/$mode" PSD_ARGS="--set server.threads=$threads --set server.batch_wait_ms=$wait ${PLACE:-}" \
    bench/trainers.sh
done
