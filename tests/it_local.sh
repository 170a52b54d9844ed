#!/usr/bin/env bash
# Integration: psd's local transport (server.local_socket; trainers on psd's
# host dial local:PATH; docs/protocol.md "The local transport"):
#  1. the same training through it as through gRPC: ps-train --seed 7, one
#     trainer, 12 batches against a fresh psd each time, prints the same
#     losses over local:PATH as over 127.0.0.1:PORT, and psd counts the
#     calls as local ones (psd_local_calls_total);
#  2. the socket is psd's user's only (mode 600) and goes when psd stops;
#     --check-config refuses a socket in a directory that does not exist;
#  3. a broken or hostile client (tests/local_hostile.py, written from the
#     header's layout): malformed hellos (no memfd, unsealed, wrong size,
#     bad magic or version, truncated) and requests (unknown method, longer
#     than the region, undecodable, truncated) get the codes the protocol
#     says, and psd goes on serving; 100 connections from one client (a
#     token) get server.max_calls / 4 = 64 accepted and the rest refused
#     (RESOURCE_EXHAUSTED), psd's memory stays bounded (< 64 MiB more) and a
#     trainer of another client (token) trains meanwhile;
#  4. a trainer killed while its sync Step waits in its round: psd notices
#     the connection go (psd_local_connections back to 0) and serves on.
# Exactly once over it (deadlines, retries, restarts, SIGKILL) is
# it_sync_once.sh with LOCAL=1, run here too.
. "$(dirname "$0")/lib.sh" it_local
DATA=${DATA:-data/mnist}
[ -e "$DATA/train-images-idx3-ubyte" ] || { echo "it_local: skipped: no MNIST in $DATA"; exit 77; }
require_py numpy

start_psd() {  # log args...; sets psd port sock
  local log=$1; shift
  port=$(free_port); sock=$tmp/psd.sock
  "$BUILD/bin/psd" --listen "127.0.0.1:$port" --metrics-listen "127.0.0.1:$((port + 1))" \
    --set "server.local_socket=$sock" "$@" 2>>"$tmp/$log" &
  psd=$!; pids+=("$psd")
  wait_port "$((port + 1))"
  wait_for 30 "psd's local socket" test -S "$sock"
}
stop_psd() { kill -TERM "$psd"; wait "$psd" || fail "psd did not stop cleanly"; }
metric() { curl -sf "http://127.0.0.1:$((port + 1))/metrics" | sed -n "s/^$1 //p"; }
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$psd/status"; }
metric_is() { [ "$(metric "$1")" "$2" "$3" ]; }  # NAME OP VALUE, read again at each wait_for try

# 1. the same losses through both transports
run() {  # target out
  "$BUILD/bin/ps-train" --server "$1" --data "$DATA" --seed 7 --max-batches 12 --log-every 4 --no-eval \
    --wait-s 10 >"$2" 2>&1 || { cat "$2"; fail "ps-train over $1"; }
  grep -o 'loss[^,]*' "$2" >"$2.loss" || true
}
start_psd psd1.log --set server.compute_threads=2
run "127.0.0.1:$port" "$tmp/tcp"
stop_psd
start_psd psd2.log --set server.compute_threads=2
run "local:$sock" "$tmp/local"
calls=$(metric psd_local_calls_total)
[ -s "$tmp/tcp.loss" ] || fail "no loss lines"
cmp -s "$tmp/tcp.loss" "$tmp/local.loss" || { paste "$tmp/tcp.loss" "$tmp/local.loss"; fail "the losses differ"; }
[ "${calls:-0}" -ge 12 ] || fail "psd_local_calls_total=$calls after 12 batches over local:$sock"
echo "ok 1: 12 batches, the same losses over gRPC and local ($(tr '\n' ' ' <"$tmp/tcp.loss")); $calls local calls"

# 2. the socket's mode, its removal, --check-config
mode=$(stat -c %a "$sock")
[ "$mode" = 600 ] || fail "the local socket's mode is $mode, not 600"
stop_psd
[ ! -e "$sock" ] || fail "psd left its local socket $sock behind"
if "$BUILD/bin/psd" --check-config configs/local.yaml --set "server.local_socket=$tmp/no/such/dir/psd.sock" >"$tmp/cc.out" 2>&1; then
  fail "--check-config accepted a local socket in a missing directory"
fi
grep -q "server.local_socket" "$tmp/cc.out" || { cat "$tmp/cc.out"; fail "--check-config's refusal does not name server.local_socket"; }
"$BUILD/bin/psd" --check-config configs/local.yaml --set "server.local_socket=$tmp/ok.sock" >"$tmp/cc2.out" 2>&1 ||
  { cat "$tmp/cc2.out"; fail "--check-config refused a good local socket"; }
echo "ok 2: socket mode 600, removed at stop; --check-config names server.local_socket"

# 3. hostile clients: malformed messages (no tokens)
start_psd psd3.log
"$PY" tests/local_hostile.py "$sock" garbage >"$tmp/garbage.out" 2>"$tmp/garbage.log" || fail "local_hostile.py garbage"
want="hello_without_memfd 3
unsealed_memfd 3
memfd_of_the_wrong_size 3
bad_magic 3
bad_version 3
tiny_region 3
truncated_hello 3
unknown_method 12
request_longer_than_region 8
request_of_2^63_bytes 8
garbage_request_bytes 3
truncated_request 3
closed_after_malformed 0"
diff <(echo "$want") "$tmp/garbage.out" >"$tmp/garbage.diff" || { cat "$tmp/garbage.diff"; fail "unexpected answers to malformed messages"; }
"$BUILD/bin/ps-train" --status --server "local:$sock" >/dev/null 2>&1 || fail "psd did not answer over local after the malformed messages"
echo "ok 3a: $(wc -l <"$tmp/garbage.out") malformed hellos and requests answered as the protocol says; psd serves on"
stop_psd

# ... and a flood of connections from one client (a token) while another trains
printf 'flood trainer flood-0123456789abcdef\ntrainer trainer trainer-0123456789abcdef\n' >"$tmp/tokens"
printf 'trainer-0123456789abcdef\n' >"$tmp/trainer.token"
chmod 600 "$tmp/tokens" "$tmp/trainer.token"
start_psd psd4.log --set "security.tokens_file=$tmp/tokens"
rss0=$(rss_kb)
exec 7> >(TOKEN=flood-0123456789abcdef "$PY" tests/local_hostile.py "$sock" flood 100 >"$tmp/flood.out" 2>"$tmp/flood.log")
wait_for 60 "the flood's 100 connections" grep -q ok= "$tmp/flood.out"
read -r ok refused other < <(sed 's/[a-z]*=//g' "$tmp/flood.out")
[ "$ok" = 64 ] && [ "$refused" = 36 ] && [ "$other" = 0 ] || fail "flood of 100: $(cat "$tmp/flood.out"), want ok=64 refused=36 other=0"
conns=$(metric psd_local_connections)
[ "$conns" = 64 ] || fail "psd_local_connections=$conns with 64 held"
rss1=$(rss_kb)
[ $((rss1 - rss0)) -lt 65536 ] || fail "psd's RSS grew $(((rss1 - rss0) / 1024)) MiB for 64 idle local connections"
"$BUILD/bin/ps-train" --server "local:$sock" --set "security.token_file=$tmp/trainer.token" --data "$DATA" \
  --max-batches 5 --no-eval >"$tmp/t0.log" 2>&1 || { cat "$tmp/t0.log"; fail "another client could not train during the flood"; }
exec 7>&-
wait_for 30 "the flood's connections to close" metric_is psd_local_connections = 0
echo "ok 3b: 100 connections of one token: 64 accepted, 36 refused, RSS +$(((rss1 - rss0) / 1024)) MiB; another token's trainer trained meanwhile"
stop_psd

# 4. a trainer killed while its Step waits in a sync round
start_psd psd5.log --set server.consistency=sync --set server.sync_workers=2 --set server.sync_timeout_s=60
"$BUILD/bin/ps-train" --server "local:$sock" --rank 1 --world-size 3 --data "$DATA" --max-batches 5 --no-eval \
  --log-every 1 >"$tmp/t1.log" 2>&1 &
t1=$!; pids+=("$t1")
# its first batch's Step waits for a second member: ListParameters, then the batch's call, held
wait_for 60 "the trainer's batch call" metric_is psd_local_calls_total -ge 2
sleep 0.5
grep -q "training batch 0 " "$tmp/t1.log" && fail "a sync round of 2 stepped with one trainer"
[ "$(metric psd_local_connections)" = 1 ] || fail "no local connection while the trainer waits"
kill -KILL "$t1"; wait "$t1" 2>/dev/null || true
wait_for 10 "psd to drop the killed trainer's connection" metric_is psd_local_connections = 0
"$BUILD/bin/ps-train" --status --server "local:$sock" >/dev/null 2>&1 || fail "psd did not answer after the kill"
stop_psd
echo "ok 4: a trainer killed in a sync round: its connection closed, psd serves on"

# exactly once over the local transport
LOCAL=1 BUILD="$BUILD" bash tests/it_sync_once.sh >"$tmp/sync_once.log" 2>&1 || { tail -20 "$tmp/sync_once.log"; fail "it_sync_once over local"; }
tail -1 "$tmp/sync_once.log"
echo "it_local: the local transport trains as gRPC does, refuses what it must, serves on: OK"
