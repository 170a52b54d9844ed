#!/usr/bin/env bash
# Integration: `psd --check-config` runs every check start-up makes (it used
# to pass configs that start-up then refused), without binding or writing:
#  - the shipped configs/psd.yaml (the systemd unit's) passes and starts;
#  - a world-readable tokens file, a missing certificate, a checkpoint_dir
#    that is a file, plaintext on 0.0.0.0 are refused, naming the problem;
#  - a busy port is only a warning (psd itself may be running).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
tmp=$(mktemp -d /tmp/it_check_config.XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 $p 2>/dev/null || true; done; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
psd() { "$BUILD/bin/psd" "$@"; }
port=$(( 20000 + RANDOM % 20000 ))

out=$(psd --check-config configs/psd.yaml --set server.checkpoint_dir="$tmp/ck" 2>&1) || fail "configs/psd.yaml: $out"
echo "ok: configs/psd.yaml passes --check-config"
"$BUILD/bin/psd" --config configs/psd.yaml --listen "127.0.0.1:$port" --set server.metrics_listen="127.0.0.1:$((port + 1))" \
  --set server.checkpoint_dir="$tmp/ck" 2>"$tmp/psd.log" &
psdpid=$!; pids+=($psdpid)
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
(exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null || { cat "$tmp/psd.log"; fail "configs/psd.yaml does not start"; }
echo "ok: configs/psd.yaml starts (listens on loopback)"

refused() {  # what needle args...
  local what=$1 needle=$2; shift 2
  if psd --check-config configs/psd.yaml --set server.checkpoint_dir="$tmp/ck2" "$@" >"$tmp/out" 2>&1; then
    cat "$tmp/out"; fail "--check-config passed $what"; fi
  grep -q -- "$needle" "$tmp/out" || { cat "$tmp/out"; fail "$what: expected '$needle'"; }
  echo "ok: --check-config refuses $what: $(grep -o -- "$needle.\{0,50\}" "$tmp/out" | head -n 1)"
}
printf 'a trainer %s\n' "$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')" >"$tmp/tokens"; chmod 644 "$tmp/tokens"
refused "a world-readable tokens file" "chmod 600" --set security.tokens_file="$tmp/tokens"
refused "a missing certificate" "$tmp/nope.pem" --set security.tls=true --set security.cert="$tmp/nope.pem" \
  --set security.key="$tmp/nope.key"
touch "$tmp/file"
refused "a checkpoint_dir that is a file" "not a directory" --set server.checkpoint_dir="$tmp/file"
refused "plaintext on 0.0.0.0" "only allowed on loopback" --listen "0.0.0.0:$port"
out=$(psd --check-config configs/psd.yaml --set server.checkpoint_dir="$tmp/ck" --listen "127.0.0.1:$port" 2>&1) ||
  fail "a busy port failed --check-config: $out"
[[ "$out" == *"already in use"* ]] || fail "no warning about the busy port: $out"
echo "ok: a busy port is a warning only"
kill -TERM $psdpid; wait $psdpid || { cat "$tmp/psd.log"; fail "psd with configs/psd.yaml did not stop cleanly"; }
echo "it_check_config: --check-config runs every start-up check; the shipped config starts: OK"
