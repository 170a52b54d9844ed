#!/usr/bin/env bash
# Integration: the real psd and ps-train over TLS with client certificates
# and bearer tokens (throw-away certificates from scripts/gen-test-certs.sh).
#  - a trainer with the CA, its certificate and a trainer token trains;
#  - a reader token may read Status but not train (PERMISSION_DENIED);
#  - no token -> UNAUTHENTICATED; a wrong CA or no client certificate -> no
#    connection (UNAVAILABLE);
#  - psd refuses plaintext on a non-loopback address unless
#    security.allow_insecure is set, and refuses a world-readable tokens file.
. "$(dirname "$0")/lib.sh" it_security
DATA=${DATA:-data/mnist}
command -v openssl >/dev/null || { echo "it_security: skipped: openssl not installed"; exit 77; }
scripts/gen-test-certs.sh "$tmp/c" >/dev/null
c="$tmp/c"
tt=$(openssl rand -hex 32); tr=$(openssl rand -hex 32)
printf 'trainer1 trainer %s\nmonitor reader %s\n' "$tt" "$tr" >"$tmp/tokens"; chmod 600 "$tmp/tokens"
printf '%s\n' "$tt" >"$tmp/tt"; printf '%s\n' "$tr" >"$tmp/tr"; chmod 600 "$tmp/tt" "$tmp/tr"
port=$(free_port)
addr="localhost:$port"
srv=(--set security.tls=true --set security.cert="$c/server.pem" --set security.key="$c/server.key"
     --set security.mutual_tls=true --set security.ca="$c/ca.pem")
"$BUILD/bin/psd" --listen "127.0.0.1:$port" "${srv[@]}" --set security.tokens_file="$tmp/tokens" 2>"$tmp/psd.log" &
psd=$!; pids+=("$psd")
cl=(--server "$addr" --set security.tls=true --set security.ca="$c/ca.pem"
    --set security.client_cert="$c/client.pem" --set security.client_key="$c/client.key" --set trainer.rpc_timeout_s=5)
for _ in $(seq 100); do "$BUILD/bin/ps-train" "${cl[@]}" --set security.token_file="$tmp/tr" --status >/dev/null 2>&1 && break; sleep 0.1; done

expect_fail() {  # what needle args...
  local what=$1 needle=$2; shift 2
  if "$BUILD/bin/ps-train" "$@" >"$tmp/out" 2>&1; then echo "FAIL: $what succeeded"; cat "$tmp/out"; exit 1; fi
  grep -q "$needle" "$tmp/out" || { echo "FAIL: $what: expected '$needle':"; cat "$tmp/out"; exit 1; }
  echo "ok: $what -> $(grep -o "$needle.\{0,60\}" "$tmp/out" | head -n 1)"
}
"$BUILD/bin/ps-train" "${cl[@]}" --set security.token_file="$tmp/tt" --data "$DATA" --max-batches 10 --log-every 5 \
  >"$tmp/train.log" 2>&1 || { echo "FAIL: trainer over mTLS+token"; cat "$tmp/train.log"; exit 1; }
echo "ok: trainer over mutual TLS with its token: $(grep accuracy "$tmp/train.log")"
"$BUILD/bin/ps-train" "${cl[@]}" --set security.token_file="$tmp/tr" --status >"$tmp/status" 2>&1
grep -q "^model_version: 10$" "$tmp/status" || { echo "FAIL: reader status"; cat "$tmp/status"; exit 1; }
echo "ok: reader token reads Status (model_version 10)"
expect_fail "reader token training" "PERMISSION_DENIED" "${cl[@]}" --set security.token_file="$tmp/tr" --data "$DATA" --max-batches 1 --wait-s 0
expect_fail "no token" "UNAUTHENTICATED" "${cl[@]}" --status
printf '%s\n' "$(openssl rand -hex 32)" >"$tmp/bad"; chmod 600 "$tmp/bad"
expect_fail "unknown token" "UNAUTHENTICATED: invalid token" "${cl[@]}" --set security.token_file="$tmp/bad" --status
expect_fail "wrong CA" "UNAVAILABLE" "${cl[@]}" --set security.ca="$c/rogue-ca.pem" --set security.token_file="$tmp/tt" --status
expect_fail "no client certificate" "if psd requires one (security.mutual_tls), set security.client_cert and security.client_key" --server "$addr" --set security.tls=true --set security.ca="$c/ca.pem" \
  --set security.token_file="$tmp/tt" --set trainer.rpc_timeout_s=5 --status
expect_fail "plaintext client" "if psd serves TLS, set security.tls: true and security.ca" --server "127.0.0.1:$port" --set security.token_file="$tmp/tt" --set trainer.rpc_timeout_s=5 --status
kill -TERM "$psd"; wait "$psd" || { echo "FAIL: psd did not stop cleanly"; tail -n 30 "$tmp/psd.log"; exit 1; }

# psd's own refusals.
if "$BUILD/bin/psd" --listen 0.0.0.0:$port 2>"$tmp/p1"; then echo "FAIL: plaintext on 0.0.0.0 accepted"; exit 1; fi
grep -q "only allowed on loopback" "$tmp/p1" || { cat "$tmp/p1"; exit 1; }
echo "ok: psd refuses plaintext on 0.0.0.0: $(grep -o 'plaintext gRPC is only allowed on loopback addresses' "$tmp/p1")"
chmod 644 "$tmp/tokens"
if "$BUILD/bin/psd" --listen "127.0.0.1:$port" "${srv[@]}" --set security.tokens_file="$tmp/tokens" 2>"$tmp/p2"; then
  echo "FAIL: world-readable tokens file accepted"; exit 1; fi
grep -q "chmod 600" "$tmp/p2" || { cat "$tmp/p2"; exit 1; }
echo "ok: psd refuses a world-readable tokens file"
if "$BUILD/bin/psd" --listen "127.0.0.1:$port" --set security.tls=true 2>"$tmp/p3"; then echo "FAIL: tls without cert"; exit 1; fi
grep -q "security.cert" "$tmp/p3" && echo "ok: psd: $(cat "$tmp/p3")"
pids=()  # stopped above: nothing left to kill
echo "it_security: TLS, mutual TLS, tokens and refusals: OK"
