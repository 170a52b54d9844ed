# bench/lib.sh - what the bench scripts share (sourced by bench/run.sh and
# bench/trainers.sh): a free-looking port, psd's counters, and waiting for
# psd to answer.
#
#   bench_port                       a random high port (tests/ do the same)
#   psd_snap PID METRICS_ADDR FILE   psd's cost counters now, into FILE:
#     psd_stat t=<s> cpu_s=<utime+stime> minflt=<n> runq_s=<s> ctxsw=<n>
#     (t: CLOCK_MONOTONIC-like seconds (/proc/uptime); runq_s: time psd's
#     threads spent runnable but waiting for a CPU (schedstat); ctxsw:
#     voluntary + involuntary switches of its threads) followed by its
#     /metrics lines psd_call_phase_*, psd_samples_total (the phase
#     accounting, server.profile), psd_batched_* (batched calls) and
#     psd_worker_poll_seconds_total (server.idle_poll_us). Two snapshots give the cost of what ran
#     between them, whatever else the machine ran.
#   wait_psd ADDR                    until a TCP connect to ADDR succeeds (10 s)
#   lm_flop_per_token                the FLOPs one training token of rnn_lm at
#                                    configs/rnn_lm.yaml's sizes costs (below)
#   lm_tokens MODE K WINDOWS DATA DIR  psd (configs/rnn_lm.yaml) + K `ps-train lm`
#                                    trainers, decoder MODE (fused, logits),
#                                    WINDOWS windows each: prints the tokens/s of
#                                    all trainers together (their tokens over the
#                                    longest trainer's time); logs under DIR; DIR/cpu-MODE-K.txt gets
#                                    the CPU per token: psd's (utime + stime while
#                                    the trainers ran) and the trainers' (their
#                                    training loops), which load disturbs less
#                                    than tokens/s, and psd's wait for the
#                                    weights locks (its phase counters) per
#                                    Step and in all calls per token.
#                                    LM_WARMUP windows per trainer (default 3)
#                                    run first against the same psd, untimed.
#                                    LM_PSD_ARGS: more psd flags (e.g. --set KEY=VALUE).
#   lm_trainers PORT K MODE DATA WINDOWS LOGPREFIX  K `ps-train lm` trainers
#                                    against that psd, logs LOGPREFIX-tR.log;
#                                    fails when one did

bench_port() { echo $(( 20000 + RANDOM % 20000 )); }

# Debian's python3 (PyTorch, grpcio) where it is; elsewhere (a GPU machine's
# image, for the scripts that only need the standard library) the first on PATH.
PY=${PY:-/usr/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3 || echo /usr/bin/python3)

# GET http://ADDR/PATH to stdout (curl, or python3's urllib where curl is missing)
http_get() {
  if command -v curl >/dev/null 2>&1; then curl -sf "http://$1"
  else "$PY" -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen("http://" + sys.argv[1], timeout=10).read().decode())' "$1" 2>/dev/null
  fi
}

psd_snap() {
  local pid=$1 maddr=$2 out=$3
  {
    awk -v tck="$(getconf CLK_TCK)" -v t="$(cut -d' ' -f1 /proc/uptime)" \
      '{printf "psd_stat t=%s cpu_s=%.3f minflt=%d", t, ($14 + $15) / tck, $10}' "/proc/$pid/stat"
    cat /proc/"$pid"/task/*/schedstat 2>/dev/null | awk '{w += $2} END {printf " runq_s=%.6f", w / 1e9}'
    cat /proc/"$pid"/task/*/status 2>/dev/null | awk '/ctxt_switches/ {s += $2} END {printf " ctxsw=%d\n", s}'
    if [ -n "$maddr" ]; then
      http_get "$maddr/metrics" | grep -E '^psd_call_phase_|^psd_samples_total|^psd_batched_|^psd_worker_poll_seconds_total' || true
    fi
  } >"$out"
}

wait_psd() {
  local host=${1%:*} port=${1##*:}
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# rnn_lm at configs/rnn_lm.yaml's sizes: ntoken V, ninp E, nhid H, 2 LSTM
# layers on the trainer, the decoder on psd (the embedding's lookup is no
# multiply-add). A training token: forward + backward = 3x the forward's
# multiply-adds, 2 FLOPs each.
LM_V=10000 LM_E=200 LM_H=200
lm_flop_per_token() {
  echo $(( 2 * 3 * (4 * LM_H * (LM_E + LM_H) + 4 * LM_H * (LM_H + LM_H) + LM_V * LM_H) ))
}

# K `ps-train lm` trainers against psd on PORT, WINDOWS windows each, rank r
# logging to LOGPREFIX-tr.log; waits for all, fails when one did
lm_trainers() {  # port k mode data windows logprefix
  local port=$1 k=$2 mode=$3 data=$4 windows=$5 log=$6 r p pids=() fail=0
  for r in $(seq 1 "$k"); do
    "$BUILD/bin/ps-train" lm --config configs/rnn_lm.yaml --server "127.0.0.1:$port" --rank "$r" \
      --world-size $((k + 1)) --data "$data" --decoder "$mode" --max-batches "$windows" --log-every 1000 \
      --no-eval >"$log-t$r.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || fail=1; done
  return "$fail"
}

lm_tokens() {
  local mode=$1 k=$2 windows=$3 data=$4 dir=$5 port
  port=$(bench_port)
  mkdir -p "$dir"
  # shellcheck disable=SC2086
  "$BUILD/bin/psd" --config configs/rnn_lm.yaml --listen "127.0.0.1:$port" --metrics-listen "127.0.0.1:$((port + 1))" \
    ${LM_PSD_ARGS:-} 2>"$dir/psd-$mode-$k.log" &
  local psd=$! psd_cpu0
  wait_psd "127.0.0.1:$port" || true
  # a short round first, as section 2 does for MNIST: psd's first windows
  # touch some 300 MB of new memory (oneDNN's GEMM packing buffers, the
  # pool), which a 20-window run would otherwise count as training
  if [ "${LM_WARMUP:-3}" -gt 0 ]; then
    lm_trainers "$port" "$k" "$mode" "$data" "${LM_WARMUP:-3}" "$dir/lm-$mode-$k-warmup" \
      || echo "lm_tokens: a warm-up trainer failed; see $dir/lm-$mode-$k-warmup-t*.log" >&2
  fi
  psd_cpu0=$(awk -v tck="$(getconf CLK_TCK)" '{printf "%.3f", ($14 + $15) / tck}' "/proc/$psd/stat" 2>/dev/null || echo 0)
  local fail=0
  lm_trainers "$port" "$k" "$mode" "$data" "$windows" "$dir/lm-$mode-$k" || fail=1
  local psd_cpu1
  psd_cpu1=$(awk -v tck="$(getconf CLK_TCK)" '{printf "%.3f", ($14 + $15) / tck}' "/proc/$psd/stat" 2>/dev/null || echo 0)
  http_get "127.0.0.1:$((port + 1))/metrics" >"$dir/metrics-$mode-$k.txt" 2>/dev/null || true
  kill -TERM "$psd"; wait "$psd" || true
  if [ "$fail" != 0 ]; then
    echo "lm_tokens: a trainer failed ($mode, $k trainers); see $dir/lm-$mode-$k-t*.log" >&2
    return 1
  fi
  cat "$dir"/lm-"$mode"-"$k"-t*.log | awk -v p0="$psd_cpu0" -v p1="$psd_cpu1" '
    /samples in/ { s += $3 } /CPU .* in the training loop/ { c += $4 }
    END { printf "psd_us_tok=%.1f trainer_us_tok=%.1f\n", s ? (p1 - p0) * 1e6 / s : 0, s ? c * 1e6 / s : 0 }' \
    >"$dir/cpu-$mode-$k.txt"
  # psd's lock waits (phase "lock"): per Step, and over every call per token
  local toks
  toks=$(cat "$dir"/lm-"$mode"-"$k"-t*.log | awk '/samples in/ { s += $3 } END { print s + 0 }')
  awk -v n="$toks" '
    /^psd_call_phase_seconds_total\{method="Step",phase="lock"\}/ { sl = $2 }
    /^psd_call_phase_seconds_total\{.*phase="lock"\}/ { al += $2 }
    /^psd_call_phase_calls_total\{method="Step"\}/ { sc = $2 }
    END { printf "step_lock_ms=%.2f lock_us_tok=%.1f\n", sc ? sl * 1e3 / sc : 0, n ? al * 1e6 / n : 0 }' \
    "$dir/metrics-$mode-$k.txt" >"$dir/lock-$mode-$k.txt"
  cat "$dir"/lm-"$mode"-"$k"-t*.log | awk '/samples in/ { s += $3; if ($6 > t) t = $6 } END { printf "%.0f", s / t }'
}
