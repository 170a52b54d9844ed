#!/usr/bin/env bash
# Integration: hostile and careless clients against the real psd on loopback
# (tests/hostile.py speaks HTTP/2 by hand; docs/security.md lists the limits).
# For each attack a well-behaved grpcio client keeps calling Health/Check,
# Status and GetParameters; psd's RSS growth and that client's worst latency
# are printed, and loose bounds asserted (properties, not timings):
#  1. plaintext, no tokens; the attacker connects from 127.0.0.2, so it is
#     another client than the well-behaved one (127.0.0.1):
#     - stall: 400 calls that never send their request -> the client's share
#       of calls fills, its calls are cancelled after server.recv_timeout_s,
#       everyone else is served; the same from 4 addresses at once (each
#       keeps server.max_stalled_per_client), with a monitor on an
#       attacker's host answered within 1 s;
#     - silent: 400 GetParameters whose 4.8 MB replies are never read ->
#       cancelled after server.send_timeout_s, memory bounded by the
#       client's share;
#     - reset: HEADERS + RST_STREAM as fast as it goes, reconnecting when
#       closed -> psd closes each such connection; RSS bounded; the same over
#       300 connections, each under the per-connection threshold -> the
#       host is cut off, its new connections refused;
#     - continuation: one stream's header block never ends (CONTINUATION
#       frames without END_HEADERS), reconnecting when closed -> psd closes
#       each such connection (no progress for its bytes); RSS bounded;
#  2. mutual TLS + tokens: the same rapid reset without a token (refused in
#     the transport), and with a valid token (connections closed);
#  3. the context memory budget shared per token (tests/hostile_ctx.py);
#     ssp: Forwards held back for the slowest rank and given up by their
#     client are freed at once, never run (tests/hostile_ssp.py);
#  4. the metrics/health port answers with 1,100 idle gRPC connections open
#     (libmicrohttpd on epoll, not select: tests/many_conns.py);
#  5. ps-train refuses test images of other dimensions than the model's.
. "$(dirname "$0")/lib.sh" it_hostile
require_py grpc grpc_tools numpy
command -v openssl >/dev/null || { echo "it_hostile: skipped: openssl not installed"; exit 77; }
fail() { echo "FAIL: $*"; for f in "$tmp"/*.log; do [ -f "$f" ] && { echo "--- $f"; grep -v 'refused: RESOURCE_EXHAUSTED' "$f" | tail -n 15; }; done; exit 1; }

start_psd() {  # log args... ; sets psd, port
  local log=$1; shift
  port=$(free_port)
  psdlog=$tmp/$log
  "$BUILD/bin/psd" --listen "127.0.0.1:$port" --set server.log_level=warn "$@" 2>"$psdlog" &
  psd=$!; pids+=("$psd")
  for _ in $(seq 100); do
    (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && return 0
    kill -0 "$psd" 2>/dev/null || fail "psd did not start: $(tail -n 3 "$tmp/$log")"
    sleep 0.1
  done
  fail "psd did not listen on $port"
}
stop_psd() {  # [grace-ok]: psd may wait out server.grace_s (open contexts that never step)
  local t0=$EPOCHREALTIME
  kill -TERM "$psd"; wait "$psd" || fail "psd did not stop cleanly after the attacks"
  stop_s=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  # psd logs what it waited for when a grace period runs out (psd.c, rpc_setup.c)
  [ "${1:-}" = grace-ok ] || ! grep -a "grace.*over" "$psdlog" ||
    fail "psd waited out its shutdown grace ($stop_s s after SIGTERM), for what it logged above"
}
attack() {  # name args...
  local name=$1; shift
  timeout 150 $PY tests/hostile.py "$@" >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "$name"; }
  echo "ok: $name: $(cat "$tmp/out")"
}

# How long each attack runs: past the defence's own timeouts (3 s to end a
# stalled call, 5 s a reply nobody reads; a resetting connection or host is
# cut within its first seconds), not past the latency bounds: hostile.py
# goes on attacking while a well-behaved call is in flight, until it is
# answered or over its bound (a starved call fails the run however short
# the attack). The issue-23 cases run $secs here; make test-hostile runs
# them 60 s.
secs=${HOSTILE_SECONDS:-7}
stall_s=7  # > server.recv_timeout_s (3) + the stall grace and a loaded machine's slack
reset_s=5
tls_reset_s=8  # under mTLS: a reader token's resetting connection was not cut within 5 s in a fresh-clone make test

# 1. plaintext
limits=(--set server.recv_timeout_s=3 --set server.send_timeout_s=5)
start_psd psd1.log "${limits[@]}"
attack "stalled requests" stall 127.0.0.1 "$port" "$psd" $stall_s --n 400 --max-rss-mb 300 --max-latency-s 5 \
  --expect-ended 3
# (--expect-ended 3: every stream ended by psd, refused at once or accepted
# and cancelled, each within server.recv_timeout_s (3) and a slack of its
# opening.)
# 4 addresses, each holding 64 calls and 16 Status calls that never send
# their request, replacing what psd ends (issue 23 item 8: they filled the
# call cap, every well-behaved call refused): each keeps
# server.max_stalled_per_client (16); a monitor on the first attacker's host,
# on a connection of its own, is answered every time, within 1 s (or 10x its
# unloaded latency measured in the same run, on a loaded machine), and so
# are the well-behaved client's Health and Status.
attack "stalled requests from 4 addresses" stall 127.0.0.1 "$port" "$psd" "$secs" --sources 4 --n 64 \
  --status-streams 16 --keep-up --monitor --max-rss-mb 300 --max-latency-s 5
# (a well-behaved GetParameters may queue behind the handlers of the
# attacker's 64 admitted ones, each encoding 4.8 MB: seconds on a loaded
# 2-core machine - 5.4 and 6.9 s seen. Bounded by 10 s: not starved (the
# attack goes on while such a call waits). Health and Status, and a monitor
# on the attacker's host: within 1 s, as above.)
# (--expect-ended 5: psd accepted some of the silent calls and ended each
# within server.send_timeout_s (5) and a slack of the start of its reply;
# the refused ones do not count.)
attack "silent readers" silent 127.0.0.1 "$port" "$psd" $stall_s --n 400 --max-rss-mb 800 --max-latency-s 10 \
  --expect-ended 5 --monitor
attack "rapid reset" reset 127.0.0.1 "$port" "$psd" $reset_s --max-rss-mb 1000 --max-latency-s 8 --expect-cut
grep -q "HTTP/2 rapid reset" "$tmp/psd1.log" || fail "psd did not log the rapid reset"
# the same spread over 300 connections from one address, each under the
# per-connection threshold (issue 23 item 2: RSS +1.9 GB, well-behaved
# latency 26-30 s; main's psd here: 2 calls answered in 10 s, worst 12 s):
# the host is cut off as a whole, and its new connections past
# server.max_connections_per_client (64) are refused by the listener
attack "rapid reset over 300 connections from one address" reset-many 127.0.0.1 "$port" "$psd" "$secs" \
  --conns 300 --expect-cut --max-rss-mb 1000 --max-latency-s 8 --min-ok 10
grep -q "over all its connections" "$tmp/psd1.log" || fail "psd did not log the host's rapid reset"
# a header block that never ends (HEADERS, then CONTINUATION frames without
# END_HEADERS): gRPC 1.51 keeps every header and psd never sees the call
# (main's psd: RSS +1.25 GiB in 8 s, +3.4 GiB in 25 s, well-behaved calls
# waiting 11-30 s); psd closes a connection whose socket received more than
# it may without a call's headers or message completing, within a quarter
# second (PS_RPC_CONN_SCAN_MS): gRPC keeps ~6 bytes per byte of such frames,
# and with the earlier 1 s scan RSS grew 722 MiB in make test-hostile's 60 s
# on an AVX2 host (93 MiB with the 250 ms scan)
attack "CONTINUATION flood" continuation 127.0.0.1 "$port" "$psd" "$secs" --expect-cut --max-rss-mb 250 \
  --max-latency-s 8 --min-ok 10
grep -q "without completing a call's headers" "$tmp/psd1.log" || fail "psd did not log the header flood"
stop_psd

# 1b. SIGTERM while a stalled client (127.0.0.2) and a silent reader
#     (127.0.0.3) hold their shares of calls (the default 30 s / 60 s
#     timeouts, the default 10 s grace), and a client that stopped reading
#     (127.0.0.4: its connection cannot take the GOAWAY): psd cancels their
#     calls and closes that connection rather than wait out the grace for
#     them (server.grace_s is for calls psd works on; tests/test_rpc.c
#     checks that those are still answered)
start_psd psd1b.log
# one after another, each held before the next starts (psd logs at most 10
# refusal lines a second: the stalled client's line must not be dropped
# among the silent reader's refusals): the stalled client's calls past the
# stall grace (those beyond server.max_stalled_per_client cancelled), the
# silent reader's call share (those beyond refused), the deaf client's calls
timeout 60 $PY tests/hostile.py stall 127.0.0.1 "$port" "$psd" 30 --n 64 >"$tmp/hold-stall.out" 2>&1 &
holders=($!); pids+=($!)
wait_for 60 "the stalled client held its share" grep -aq "cancelled [0-9]* calls that stalled" "$psdlog"
timeout 60 $PY tests/hostile.py silent 127.0.0.1 "$port" "$psd" 30 --n 80 --source 127.0.0.3 \
  >"$tmp/hold-silent.out" 2>&1 &
holders+=($!); pids+=($!)
wait_for 60 "the silent reader held its share" grep -aq "ipv4:127.0.0.3 holds 64 calls" "$psdlog"
timeout 60 $PY tests/hostile.py deaf 127.0.0.1 "$port" "$psd" 30 --n 32 --source 127.0.0.4 >"$tmp/hold-deaf.out" 2>&1 &
holders+=($!); pids+=($!)
wait_for 60 "the deaf client sent its calls" grep -q "deaf: calls sent" "$tmp/hold-deaf.out"
stop_psd
for p in "${holders[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done  # they see psd gone
cancelled=$(grep -a -o "cancelled [0-9]* calls\? that stalled (request never sent or reply never read) while stopping" \
  "$psdlog" | awk '{ n += $2 } END { print n + 0 }')
[ "$cancelled" -gt 0 ] || fail "psd did not cancel the stalled calls when it stopped"
grep -aq "every call ended .* closing them" "$psdlog" || fail "psd did not close the deaf client's connection"
echo "ok: SIGTERM with a stalled client, a silent reader and a deaf one holding their calls: psd stopped in" \
  "$stop_s s (grace 10 s), cancelling $cancelled of their calls and closing the deaf connection"

# 2. mutual TLS + tokens
scripts/gen-test-certs.sh "$tmp/c" >/dev/null
c="$tmp/c"
tt=$(openssl rand -hex 32); tr=$(openssl rand -hex 32)
tr2=$(openssl rand -hex 32); tr3=$(openssl rand -hex 32); tr4=$(openssl rand -hex 32)
printf 'trainer1 trainer %s\nmonitor reader %s\nreader2 reader %s\nreader3 reader %s\nreader4 reader %s\n' \
  "$tt" "$tr" "$tr2" "$tr3" "$tr4" >"$tmp/tokens"; chmod 600 "$tmp/tokens"
start_psd psd2.log "${limits[@]}" --set security.tls=true --set security.cert="$c/server.pem" \
  --set security.key="$c/server.key" --set security.mutual_tls=true --set security.ca="$c/ca.pem" \
  --set security.tokens_file="$tmp/tokens"
tls=(--tls "$c/ca.pem" "$c/client.pem" "$c/client.key")
attack "rapid reset without a token (mTLS)" reset 127.0.0.1 "$port" "$psd" $tls_reset_s "${tls[@]}" --good-token "$tt" \
  --max-rss-mb 1000 --max-latency-s 8
attack "rapid reset with a reader token (mTLS)" reset 127.0.0.1 "$port" "$psd" $tls_reset_s "${tls[@]}" --token "$tr" \
  --good-token "$tt" --max-rss-mb 1000 --max-latency-s 8 --expect-cut
attack "forged log lines in method paths (mTLS, reader token)" forge 127.0.0.1 "$port" "$psd" 1 "${tls[@]}" \
  --token "$tr" --good-token "$tt"
! grep -a -q "^2026-01-01T00:00:00.000Z psd\[error\] FORGED\|^<0>psd" "$tmp/psd2.log" || fail "a client forged a log line"
grep -a -q 'Forward\\x0a2026-01-01T00:00:00.000Z psd\[error\] FORGED LINE\\x1b' "$tmp/psd2.log" ||
  fail "the refused forged path was not logged escaped"
echo "ok: method paths with newline/ESC are logged escaped: $(grep -a -o 'Forward\\x0a2026.\{0,40\}' "$tmp/psd2.log" | head -n 1)"
attack "stalled requests with a reader token (mTLS)" stall 127.0.0.1 "$port" "$psd" $stall_s "${tls[@]}" --token "$tr" \
  --good-token "$tt" --n 300 --max-rss-mb 300 --max-latency-s 5 --expect-ended 3
# 4 reader tokens from one address (4 clients; readers have their own call
# cap): the trainer and a monitor with the first reader's token are answered
attack "stalled requests from 4 reader tokens (mTLS)" stall 127.0.0.1 "$port" "$psd" "$secs" "${tls[@]}" \
  --tokens "$tr,$tr2,$tr3,$tr4" --good-token "$tt" --n 64 --status-streams 16 --keep-up --monitor \
  --max-rss-mb 300 --max-latency-s 5
stop_psd

# 3. context memory budget, shared per token
proto_stubs
th=$(openssl rand -hex 32); tg=$(openssl rand -hex 32)
printf 'hog trainer %s\ngood trainer %s\n' "$th" "$tg" >"$tmp/tokens2"; chmod 600 "$tmp/tokens2"
budget=$((256 << 20))
# (grace_s 1: the hog's contexts never step; psd need not wait 10 s for them to stop)
start_psd psd3.log --set server.max_context_bytes=$budget --set security.tokens_file="$tmp/tokens2" \
  --set server.grace_s=1
PYTHONPATH="$tmp" timeout 150 $PY tests/hostile_ctx.py "127.0.0.1:$port" "$psd" "$th" "$tg" $budget \
  >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "context budget"; }
echo "ok: $(cat "$tmp/out")"
stop_psd grace-ok

# 3b. ssp: Forwards held back for the slowest rank, given up by their client
#     and past their client's byte share (a quarter of server.max_context_bytes)
#     refused, not held
start_psd psd3b.log --set server.consistency=ssp --set server.max_staleness=0 \
  --set server.max_context_bytes=$((64 << 20))
PYTHONPATH="$tmp" timeout 120 $PY tests/hostile_ssp.py "127.0.0.1:$port" "$psd" 30 $((64 << 20)) >"$tmp/out" 2>&1 ||
  { cat "$tmp/out"; fail "ssp held Forwards"; }
echo "ok: ssp: $(cat "$tmp/out")"
stop_psd

# 4. the metrics/health port with more than 1,024 descriptors open in psd
if [ "$(ulimit -Hn)" = unlimited ] || [ "$(ulimit -Hn)" -ge 2048 ]; then
  mport=$(free_port)
  (ulimit -n 2048; exec "$BUILD/bin/psd" --listen "127.0.0.1:$((mport + 1))" --set server.log_level=warn \
     --set server.metrics_listen="127.0.0.1:$mport" --set server.max_connections_per_client=2000 \
     2>"$tmp/psd4.log") &
  psd=$!; pids+=("$psd"); port=$((mport + 1)); psdlog=$tmp/psd4.log
  for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$mport) 2>/dev/null && break; sleep 0.1; done
  timeout 120 $PY tests/many_conns.py "$port" "$mport" 1100 >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "metrics port"; }
  echo "ok: $(cat "$tmp/out")"
  stop_psd
else
  echo "note: metrics port with 1,100 connections not checked (hard descriptor limit $(ulimit -Hn))"
fi

# 5. a careless user: test images of other dimensions than the training
#    images (were copied past the end of the batch buffer)
mkdir -p "$tmp/d"
ln -s "$(pwd)/data/mnist/train-images-idx3-ubyte" "$tmp/d/" 2>/dev/null || true
ln -s "$(pwd)/data/mnist/train-labels-idx1-ubyte" "$tmp/d/" 2>/dev/null || true
$PY - "$tmp/d" <<'PYEOF'
import struct, sys
d = sys.argv[1]
n, r, c = 600, 32, 32
open(f"{d}/t10k-images-idx3-ubyte", "wb").write(struct.pack(">IIII", 0x803, n, r, c) + bytes(n * r * c))
open(f"{d}/t10k-labels-idx1-ubyte", "wb").write(struct.pack(">II", 0x801, n) + bytes(n))
PYEOF
if [ -e data/mnist/train-images-idx3-ubyte ]; then
  start_psd psd5.log
  if "$BUILD/bin/ps-train" --server "127.0.0.1:$port" --data "$tmp/d" --max-batches 2 --wait-s 5 >"$tmp/out" 2>&1; then
    cat "$tmp/out"; fail "ps-train accepted 32x32 test images for a 28x28 model"; fi
  grep -q "test (t10k-images-idx3-ubyte) images are 32x32, but model mnist_cnn takes 28x28" "$tmp/out" ||
    { cat "$tmp/out"; fail "no clear error for 32x32 test images"; }
  echo "ok: ps-train refuses test images of other dimensions: $(grep -o 'the test.*' "$tmp/out" | head -n 1)"
  stop_psd
fi

pids=()  # stopped above: nothing left to kill
echo "it_hostile: stalled calls, silent readers, rapid reset (plaintext and mTLS+tokens), context budget: OK"
