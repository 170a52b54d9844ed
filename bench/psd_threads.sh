#!/bin/bash
# bench/psd_threads.sh - where psd's CPU and context switches go, per thread
# kind, for psd + N bench_trainer processes on MNIST; and an A/B of psd
# builds or settings run alternately, so that load from other jobs lands on
# both sides alike (issue 22: the time a call spends outside compute).
#
# usage: bench/psd_threads.sh "LABEL|PSD_BINARY|PSD_FLAGS" ["LABEL|..." ...]
#   e.g. bench/psd_threads.sh "main|/tmp/psd-main|" "ct1|build/bin/psd|--set server.compute_threads=1"
# env: N trainers (2), BATCHES timed per trainer (150), ROUNDS (3),
#      TRAINER_FLAGS (e.g. --fuse-step), BUILD, DATA, CONFIG.
# Per run, one line: all trainers' samples / (last end - first start), psd's
# CPU per sample (utime + stime of all its threads between two snapshots
# around the timed batches), its voluntary / involuntary context switches
# per batch, and the same split by thread kind from the threads' names
# (psd-worker = the handlers' workers, where the compute runs; psd-event =
# gRPC's completion-queue threads; other = gRPC's own, OpenMP's, the
# metrics server); then psd's phases per call (server.profile: what a call
# spends in psd besides its compute). Then each label's medians.
# CPU per sample and switches are what load disturbs least; samples/s on a
# loaded machine only as the alternate runs' ratio.
set -u
cd "$(dirname "$0")/.." || exit 1
BUILD=${BUILD:-build}
DATA=${DATA:-data/mnist}
CONFIG=${CONFIG:-configs/local.yaml}
N=${N:-2}; BATCHES=${BATCHES:-150}; ROUNDS=${ROUNDS:-3}
# shellcheck source=bench/lib.sh
. bench/lib.sh
[ $# -ge 1 ] || { sed -n '2,20p' "$0"; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

snap() {  # pid -> per thread: name utime+stime(ticks) vcs nvcs
  local t
  for t in /proc/"$1"/task/*; do
    echo "$(basename "$t") $(tr ' ' _ <"$t/comm") $(cut -d' ' -f14,15 "$t/stat" | awk '{print $1 + $2}')" \
         "$(awk '/^voluntary_ctxt/ {v = $2} /^nonvoluntary_ctxt/ {n = $2} END {print v, n}' "$t/status")"
  done 2>/dev/null | LC_ALL=C sort
}

run1() {  # label binary flags...
  local label=$1 bin=$2; shift 2
  local port; port=$(bench_port)
  local addr="127.0.0.1:$port" maddr="127.0.0.1:$((port + 1))"
  "$bin" --config "$CONFIG" --listen "$addr" --metrics-listen "$maddr" "$@" 2>"$tmp/psd.log" &
  local psd=$! r pids=()
  wait_psd "$maddr" || { echo "$label: psd did not start"; cat "$tmp/psd.log"; return 1; }
  # shellcheck disable=SC2086  # TRAINER_FLAGS are words
  for r in $(seq 1 "$N"); do   # kernels, pools, connections
    "$BUILD/bench/bench_trainer" --server "$addr" --rank "$r" --batches 3 --warmup 0 --data "$DATA" \
      ${TRAINER_FLAGS:-} >/dev/null & pids+=($!)
  done
  wait "${pids[@]}"; pids=()
  snap "$psd" >"$tmp/s0"; curl -sf "http://$maddr/metrics" | grep '^psd_call_phase_' >"$tmp/m0"
  rm -f "$tmp"/t*.txt; mkdir -p "$tmp/ready"; rm -f "$tmp"/ready/*
  # shellcheck disable=SC2086
  for r in $(seq 1 "$N"); do
    "$BUILD/bench/bench_trainer" --server "$addr" --rank "$r" --batches "$BATCHES" --warmup 2 \
      --start-together "$tmp/ready" "$N" --data "$DATA" ${TRAINER_FLAGS:-} >"$tmp/t$r.txt" & pids+=($!)
  done
  wait "${pids[@]}"
  snap "$psd" >"$tmp/s1"; curl -sf "http://$maddr/metrics" | grep '^psd_call_phase_' >"$tmp/m1"
  kill -TERM "$psd"; wait "$psd" 2>/dev/null
  local e2e; e2e=$(grep -h '^trainer' "$tmp"/t*.txt | sed 's/[a-z_]*=//g' |
    awk '{s += $4; if (min == "" || $5 < min) min = $5; if ($6 > max) max = $6} END {printf "%.1f", s / (max - min)}')
  LC_ALL=C join "$tmp/s0" "$tmp/s1" | awk -v l="$label" -v e="$e2e" -v b=$((N * BATCHES)) -v tck="$(getconf CLK_TCK)" '
    { k = ($2 ~ /^psd-worker/) ? "worker" : ($2 ~ /^psd-event/) ? "event" : "other"
      c[k] += $7 - $3; v[k] += $8 - $4; n[k] += $9 - $5; C += $7 - $3; V += $8 - $4; NV += $9 - $5 }
    END { printf "%-10s e2e %7.1f samples/s  psd %6.1f us/sample  switches/batch %5.1f vol %5.1f invol", l, e,
                 C / tck / (b * 32) * 1e6, V / b, NV / b
          for (k in c) printf "  | %s %.1f us/sample %.1f/%.1f", k, c[k] / tck / (b * 32) * 1e6, v[k] / b, n[k] / b
          printf "\n" }'
  paste -d' ' "$tmp/m0" "$tmp/m1" | awk '
    /calls_total/ { c += $4 - $2; next }
    { match($1, /phase="[a-z]*"/); p = substr($1, RSTART + 7, RLENGTH - 8); v[p] += $4 - $2 }
    END { if (c) { printf "           per call (ms):"; for (p in v) if (v[p] / c >= 5e-6) printf " %s %.3f", p, v[p] / c * 1e3; printf "\n" } }'
}

for _ in $(seq 1 "$ROUNDS"); do
  for spec in "$@"; do
    IFS='|' read -r label bin flags <<<"$spec"
    # shellcheck disable=SC2086  # flags are words
    run1 "$label" "${bin:-$BUILD/bin/psd}" $flags
  done
done | tee "$tmp/all"
echo "medians over $ROUNDS rounds:"
for spec in "$@"; do
  label=${spec%%|*}
  awk -v l="$label" '$1 == l {print $3, $6, $9, $11}' "$tmp/all" | sort -n -k1,1 | awk -v l="$label" '
    { e[NR] = $1 } END { m = int((NR + 1) / 2); printf "  %-10s e2e %.1f samples/s", l, e[m] }'
  awk -v l="$label" '$1 == l {print $6}' "$tmp/all" | sort -n | awk '{a[NR] = $1} END {printf "  psd %.1f us/sample", a[int((NR + 1) / 2)]}'
  awk -v l="$label" '$1 == l {print $9 + $11}' "$tmp/all" | sort -n | awk '{a[NR] = $1} END {printf "  %.1f context switches/batch\n", a[int((NR + 1) / 2)]}'
done
