#!/usr/bin/env bash
# Integration: psd as a service, seen from the outside.
#  1. --check-config: the shipped configs pass; each kind of bad key/value
#     is refused with file, line, key and value (exit 2), flags too.
#  2. start with NOTIFY_SOCKET: READY=1 arrives once the port accepts
#     connections; health (Python grpcio) SERVING; metrics parse as
#     Prometheus text; a second psd on the same address is refused clearly.
#  3. SIGHUP reopens the log file (logrotate).
#  4. SIGTERM while a trainer trains: psd exits 0 after writing a checkpoint
#     of its final step; the trainer stops with UNAVAILABLE and a clear
#     message; the step counter in /metrics had moved.
#  5. restart: resumes from that step (not 0); the checkpoint's names and
#     shapes equal ListParameters and it loads into PyTorch; training goes
#     on from there; `ps-train status` shows it.
#  6. a truncated newest checkpoint is refused, the previous one is used.
#  7. the systemd unit passes systemd-analyze verify (when available).
. "$(dirname "$0")/lib.sh" it_service
DATA=${DATA:-data/mnist}
PROBE="$PY tests/psd_probe.py"
require_py grpc prometheus_client
port=$(free_port)
addr="127.0.0.1:$port"
murl="http://127.0.0.1:$((port + 1))/metrics"
ck="$tmp/ck"
psd_args=(--config configs/local.yaml --listen "$addr" --checkpoint-dir "$ck" --metrics-listen "127.0.0.1:$((port + 1))"
          --set server.checkpoint_every_steps=10 --set server.grace_s=5)

# Wait until psd answers a health check (at most 20 s).
wait_up() { for _ in $(seq 100); do $PROBE health "$addr" >/dev/null 2>&1 && return 0; sleep 0.2; done; fail "psd not up"; }

# ---- 1. config validation
build() { "$BUILD/bin/psd" "$@"; }
for c in configs/local.yaml configs/psd.yaml; do
  out=$(build --check-config "$c") || fail "--check-config $c"
  [[ "$out" == *"configuration OK"* ]] || fail "--check-config $c said: $out"
done
bad() {  # name, yaml text, expected message (after "<file>:<line>: ")
  local f="$tmp/$1.yaml" rc=0 out
  printf '%b' "$2" >"$f"
  out=$(build --check-config "$f" 2>&1) || rc=$?
  [ $rc -eq 2 ] || fail "$1: exit $rc, want 2 ($out)"
  [[ "$out" == *"$f:$3"* ]] || fail "$1: message '$out' lacks '$f:$3'"
}
bad unknown   'server:\n  checkpoint_dri: /x\n' "2: unknown key 'server.checkpoint_dri' (did you mean 'server.checkpoint_dir'?)"
bad steps     'server:\n  checkpoint_every_steps: ten\n' "2: server.checkpoint_every_steps: 'ten' is not an integer"
bad keep      'server:\n  listen: "127.0.0.1:1"\n  checkpoint_keep: 0\n' "3: server.checkpoint_keep: '0' is out of range [1, 1000]"
bad grace     'server:\n  grace_s: -1\n' "2: server.grace_s: '-1' is out of range [0, 3600]"
bad metrics   'server:\n  metrics_listen: "9464"\n' "2: server.metrics_listen: '9464' is not HOST:PORT"
bad empty     'server:\n  log_file:\n' "2: server.log_file: no value given"
bad lr        'optimizer:\n  lr: 0\n' "2: optimizer.lr: '0' is out of range (0, 100]"
bad placement 'model:\n  placement:\n    conv: gpu:0\n' "3: model.placement.conv: 'gpu:0' is not a device"
# a bare word that is no device reads as a server name (SERVER = SERVER/cpu):
# refused after loading, naming the key, since this config defines no servers
bad placement_word 'model:\n  placement:\n    conv: gpu\n' " model.placement.conv: 'gpu' is not a device"
out=$(build --check-config configs/local.yaml --set optimizer.type=adam --set optimizer.lr=0.001 2>&1) || fail "adam refused: $out"
[[ "$out" == *"configuration OK"* ]] || fail "--check-config with adam said: $out"
rc=0; out=$(build --check-config configs/local.yaml --set optimizer.type=adam --set optimizer.momentum=0.9 2>&1) || rc=$?
[ $rc -eq 2 ] && [[ "$out" == *"optimizer adam: momentum 0.9 is not an Adam setting"* ]] || fail "adam with momentum: $out"
rc=0; out=$(build --check-config configs/rnn_lm.yaml --set optimizer.type=adam --set optimizer.weight_decay=0.01 2>&1) || rc=$?
[ $rc -eq 2 ] && [[ "$out" == *"encoder.weight is a row-sparse parameter"*"weight_decay 0.01"* ]] ||
  fail "SparseAdam with weight decay: $out"
rc=0; out=$(build --check-config configs/local.yaml --metrics-listen localhost 2>&1) || rc=$?
[ $rc -eq 2 ] && [[ "$out" == *"command line: server.metrics_listen: 'localhost' is not HOST:PORT"* ]] || fail "flag override: $out"
rc=0; out=$(build --check-config configs/local.yaml --set model.placement.head=cpu 2>&1) || rc=$?
[ $rc -eq 2 ] && [[ "$out" == *"head"* ]] || fail "unknown stage passed --check-config: $out"
echo "config: shipped configs OK, adam accepted, 12 bad cases refused with file (and line): key: value"

# ---- 2. start under a fake systemd notify socket
: >"$tmp/notify.txt"
$PY tests/psd_probe.py notify "$tmp/notify.sock" "$addr" "$tmp/notify.txt" &
pids+=($!)
for _ in $(seq 50); do [ -S "$tmp/notify.sock" ] && break; sleep 0.1; done
NOTIFY_SOCKET="$tmp/notify.sock" "$BUILD/bin/psd" "${psd_args[@]}" --log-file "$tmp/psd.log" &
psd=$!; pids+=($psd)
wait_up
for _ in $(seq 50); do grep -q READY "$tmp/notify.txt" && break; sleep 0.1; done
grep -q "^READY=1 (port accepts connections)" "$tmp/notify.txt" || fail "sd_notify: $(cat "$tmp/notify.txt")"
[ "$($PROBE health "$addr")" = SERVING ] || fail "health"
[ "$($PROBE health "$addr" ps.ParameterServer)" = SERVING ] || fail "health ps.ParameterServer"
[[ "$($PROBE health "$addr" nope || true)" == NOT_FOUND* ]] || fail "health of an unknown service"
s0=$($PROBE metrics "$murl" psd_steps_total) || fail "metrics did not parse"
[ "$s0" = 0 ] || fail "fresh psd at step $s0"
echo "start: READY=1 after listen, health SERVING (grpcio), metrics parse, steps $s0"

rc=0; out=$("$BUILD/bin/psd" --config configs/local.yaml --listen "$addr" 2>&1) || rc=$?
[ $rc -eq 1 ] && [[ "$out" == *"$addr is already in use: another process listens there (another psd?)"* ]] ||
  fail "second psd: exit $rc: $out"
echo "second psd on $addr: refused: ${out##*psd\[error\] }"

# ---- 3. SIGHUP reopens the log file
mv "$tmp/psd.log" "$tmp/psd.log.1"
kill -HUP "$psd"
for _ in $(seq 50); do [ -s "$tmp/psd.log" ] && break; sleep 0.1; done
grep -q "reopened log file" "$tmp/psd.log" || fail "SIGHUP did not reopen the log"
echo "SIGHUP: log reopened"

# ---- 4. SIGTERM during training (the trainer retries a stopped psd for
# trainer.retry_max_s, then stops with the last error; 2 s here)
"$BUILD/bin/ps-train" --config configs/local.yaml --server "$addr" --data "$DATA" --max-batches 100000 \
    --epochs 1 --log-every 1000 --set trainer.retry_max_s=2 >"$tmp/trainer.log" 2>&1 &
trainer=$!; pids+=($trainer)
for _ in $(seq 200); do
  s1=$($PROBE metrics "$murl" psd_steps_total) || fail "metrics"
  [ "$s1" -ge 25 ] && break; sleep 0.1
done
[ "$s1" -ge 25 ] || fail "step counter did not move: $s1"
kill -TERM "$psd"
rc=0; wait "$psd" || rc=$?
[ $rc -eq 0 ] || fail "psd exit $rc after SIGTERM"
final=$(sed -n 's/.*stopped: model version \([0-9]*\),.*/\1/p' "$tmp/psd.log")
[ -n "$final" ] && [ "$final" -ge "$s1" ] || fail "no stop line"
last=$(ls "$ck" | grep -E '^ckpt-[0-9]{12}\.safetensors$' | sort | tail -n 1)
[ "$last" = "$(printf 'ckpt-%012d.safetensors' "$final")" ] || fail "newest checkpoint $last, final step $final"
rc=0; wait "$trainer" || rc=$?
[ $rc -ne 0 ] || fail "trainer exited 0 although psd stopped"
grep -q "UNAVAILABLE" "$tmp/trainer.log" || fail "trainer: no UNAVAILABLE"
echo "SIGTERM: psd exit 0 at step $final, $last written; metrics steps moved 0 -> $s1; trainer exit $rc:"
grep "ps-train: rank" "$tmp/trainer.log" | head -n 1

# ---- 5. restart resumes
"$BUILD/bin/psd" "${psd_args[@]}" 2>"$tmp/psd2.log" &
psd=$!; pids+=($psd)
wait_up
grep -q "resumed from checkpoint $ck/$last: model version $final " "$tmp/psd2.log" || fail "no resume line"
s2=$($PROBE metrics "$murl" psd_steps_total)
[ "$s2" = "$final" ] || fail "restarted at step $s2, want $final"
$PROBE ckpt "$ck/$last" "$addr" || fail "checkpoint vs ListParameters / PyTorch"
"$BUILD/bin/ps-train" --config configs/local.yaml --server "$addr" --data "$DATA" --max-batches 5 \
    >"$tmp/trainer2.log" 2>&1 || fail "trainer after restart"
"$BUILD/bin/ps-train" status --server "$addr" >"$tmp/status.txt" || fail "ps-train status"
grep -q "version $((final + 5)) (optimizer steps applied)" "$tmp/status.txt" || fail "status: $(cat "$tmp/status.txt")"
grep -q "last checkpoint   step $final," "$tmp/status.txt" || fail "status checkpoint: $(cat "$tmp/status.txt")"
echo "restart: resumed at step $final, trained on to $((final + 5)); ps-train status:"
sed 's/^/    /' "$tmp/status.txt" | head -n 7
kill -TERM "$psd"; wait "$psd" || fail "psd exit after second run"

# ---- 6. truncated newest checkpoint -> previous one
newest=$(ls "$ck" | grep -E '^ckpt-[0-9]{12}\.safetensors$' | sort | tail -n 1)
prev=$(ls "$ck" | grep -E '^ckpt-[0-9]{12}\.safetensors$' | sort | tail -n 2 | head -n 1)
[ "$newest" != "$prev" ] || fail "need two checkpoints"
truncate -s 1000000 "$ck/$newest"
"$BUILD/bin/psd" "${psd_args[@]}" 2>"$tmp/psd3.log" &
psd=$!; pids+=($psd)
wait_up
grep -q "checkpoint refused: $ck/$newest:" "$tmp/psd3.log" || fail "truncated checkpoint not refused"
grep -q "resumed from checkpoint $ck/$prev" "$tmp/psd3.log" || fail "did not fall back to $prev"
kill -TERM "$psd"; wait "$psd" || fail "psd exit after third run"
echo "truncated $newest: $(grep -o 'checkpoint refused: .*' "$tmp/psd3.log" | sed "s|$ck/||g" | head -c 160)"
echo "  -> resumed from $prev"

# ---- 7. the unit file
if command -v systemd-analyze >/dev/null 2>&1; then
  sed -e "s|@BINDIR@|$PWD/$BUILD/bin|g" -e 's|@SYSCONFDIR@|/etc|g' -e "s|@DOCDIR@|$PWD|g" \
      systemd/psd.service.in >"$tmp/psd.service"
  out=$(systemd-analyze verify "$tmp/psd.service" 2>&1) || fail "systemd-analyze: $out"
  [ -z "$out" ] || fail "systemd-analyze verify: $out"
  echo "systemd-analyze verify psd.service: clean"
  sed -e "s|@BINDIR@|$PWD/$BUILD/bin|g" -e 's|@SYSCONFDIR@|/etc|g' -e "s|@DOCDIR@|$PWD|g" \
      -f systemd/psd-template.sed systemd/psd.service.in >"$tmp/psd@.service"
  grep -q "^ExecStart=$PWD/$BUILD/bin/psd --config /etc/psd/cluster.yaml --name %i$" "$tmp/psd@.service" ||
    fail "psd@.service: ExecStart is $(grep ^ExecStart "$tmp/psd@.service")"
  out=$(systemd-analyze verify "$tmp/psd@.service" 2>&1) || fail "systemd-analyze psd@.service: $out"
  [ -z "$out" ] || fail "systemd-analyze verify psd@.service: $out"
  echo "systemd-analyze verify psd@.service (template, --name %i): clean"
fi
pids=()  # stopped above: nothing left to kill
cleanup
rm -rf "$tmp"
echo "it_service: config, readiness, health, metrics, SIGHUP, SIGTERM + checkpoint, resume, fallback: OK"
