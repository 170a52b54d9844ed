#!/usr/bin/env bash
# Integration: names a hostile or careless client controls (issue 23; the
# cases are in tests/hostile_names.py): token names that share their first
# 57 characters, junk round-metric names against the stop metric, a reader
# token's health check; a tokens file with a 64-character name is refused
# when psd starts, naming the line.
. "$(dirname "$0")/lib.sh" it_hostile_names
require_py grpc grpc_tools numpy
proto_stubs
rnd() { head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
ta=$(rnd); tb=$(rnd); tr=$(rnd)
common=$(printf '%057d' 0)
printf '%sA12345 trainer %s\n%sB12345 trainer %s\nmonitor reader %s\n' "$common" "$ta" "$common" "$tb" "$tr" \
  >"$tmp/tokens"
chmod 600 "$tmp/tokens"
port=$(free_port)
"$BUILD/bin/psd" --listen "127.0.0.1:$port" --set security.tokens_file="$tmp/tokens" \
  --set server.stop_metric=reward --set server.stop_threshold=1000 2>"$tmp/psd.log" &
psd=$!; pids+=("$psd")
for _ in $(seq 150); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; kill -0 "$psd" || fail "psd died"; sleep 0.1; done
PYTHONPATH="$tmp" timeout 120 $PY tests/hostile_names.py "127.0.0.1:$port" "$ta" "$tb" "$tr" >"$tmp/out" 2>&1 ||
  { cat "$tmp/out"; fail "names"; }
echo "ok: $(cat "$tmp/out")"
kill -TERM "$psd"; wait "$psd" || fail "psd did not stop cleanly"

# a token name one character too long: refused at start, naming the line
printf '%s0 trainer %s\n' "$(printf '%063d' 0)" "$ta" >"$tmp/tokens2"; chmod 600 "$tmp/tokens2"
if "$BUILD/bin/psd" --listen "127.0.0.1:$((port + 1))" --set security.tokens_file="$tmp/tokens2" >"$tmp/out" 2>&1; then
  fail "psd started with a 64-character token name"; fi
grep -q "$tmp/tokens2:1: name '.*' must be 1..63" "$tmp/out" || { cat "$tmp/out"; fail "no clear refusal of a long name"; }
echo "ok: a 64-character token name is refused: $(grep -o 'tokens2:1: name .\{0,12\}' "$tmp/out")..."
echo "it_hostile_names: token identities compared whole, round-metric names capped per client, reader health: OK"
