#!/usr/bin/env bash
# Integration: python/psd connects with the trainer's YAML as ps-train does
# over mutual TLS with bearer tokens (throw-away certificates from
# scripts/gen-test-certs.sh): trains with the trainer token; the reader
# token reads Status and is refused training; an unknown token, a
# world-readable token file, plaintext off loopback and a rogue CA are
# refused with psd's (or ps-train's) messages (tests/python/security_check.py).
. "$(dirname "$0")/lib.sh" it_py_security
. tests/python/lib.sh
py_require it_py_security
command -v openssl >/dev/null || { echo "it_py_security: skipped: openssl not installed"; exit 77; }
psd=
on_exit() { [ -z "$psd" ] || kill -9 "$psd" 2>/dev/null; }
scripts/gen-test-certs.sh "$tmp/c" >/dev/null
c="$tmp/c"
tt=$(openssl rand -hex 32); tr=$(openssl rand -hex 32)
printf 'trainer1 trainer %s\nmonitor reader %s\n' "$tt" "$tr" >"$tmp/tokens"; chmod 600 "$tmp/tokens"
printf '%s\n' "$tt" >"$tmp/tt"; chmod 600 "$tmp/tt"
printf '%s\n' "$tt" >"$tmp/bad"; chmod 600 "$tmp/bad"
port=$(free_port)
"$BUILD/bin/psd" --config configs/local.yaml --listen "127.0.0.1:$port" --set security.tls=true \
  --set security.cert="$c/server.pem" --set security.key="$c/server.key" --set security.mutual_tls=true \
  --set security.ca="$c/ca.pem" --set security.tokens_file="$tmp/tokens" 2>"$tmp/psd.log" &
psd=$!
cat >"$tmp/trainer.yaml" <<YAML
server: {address: "127.0.0.1:$port"}
trainer: {rpc_timeout_s: 10}
security:
  tls: true
  ca: $c/ca.pem
  client_cert: $c/client.pem
  client_key: $c/client.key
  server_name: psd.test
  token_file: $tmp/tt
YAML
timeout 300 $PY tests/python/security_check.py "$tmp/trainer.yaml" "$tr" "$c/rogue-ca.pem" "$tmp/bad" >"$tmp/check.log" 2>&1 ||
  { cat "$tmp/check.log"; tail -n 20 "$tmp/psd.log"; exit 1; }
grep -v "Handshake failed" "$tmp/check.log"
kill -TERM "$psd"; wait "$psd" 2>/dev/null || true
psd=
echo "it_py_security: python/psd over mutual TLS with tokens from the trainer's YAML, and the refusals: OK"
