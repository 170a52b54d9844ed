#!/usr/bin/env bash
# Fault test (make test-faults; needs root): a network link cut in the
# middle of training, between real separate network stacks on this machine.
#
#   netns psd-P (psd, 10.200.1.1 + 10.200.2.1, listens 0.0.0.0)
#      |-- veth 10.200.1.0/24 -- netns psd-A (trainer rank 1, 10.200.1.2)
#      `-- veth 10.200.2.0/24 -- netns psd-B (trainer rank 2, 10.200.2.2)
#
# psd serves TLS with mutual TLS and bearer tokens (not loopback, so
# plaintext would be refused). After trainer A has trained a few batches,
# its link goes down for CUT_S seconds (8) and comes back. Expected: A's
# calls hit their deadline or UNAVAILABLE, it retries with backoff and
# finishes once the link is back; B never notices (no retries); psd's live
# contexts return to 0 (A's abandoned contexts expire after the TTL).
# Namespaces and veths are removed on any exit (trap). Only addresses in
# 10.200.0.0/16 inside namespaces this script creates are used.
. "$(dirname "$0")/../lib.sh" netns_link_cut
DATA=${DATA:-data/mnist}
CUT_S=${CUT_S:-8}
BATCHES=${BATCHES:-100}
[ "$(id -u)" = 0 ] || { echo "netns_link_cut: skipped: needs root for ip netns"; exit 77; }
command -v ip >/dev/null || { echo "netns_link_cut: skipped: iproute2 not installed"; exit 77; }

id=$$
P=psd-P-$id A=psd-A-$id B=psd-B-$id
on_exit() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for n in "$P" "$A" "$B"; do ip netns del "$n" 2>/dev/null || true; done
}

for n in "$P" "$A" "$B"; do ip netns add "$n"; ip -n "$n" link set lo up; done
ip link add pa$id type veth peer name ap$id
ip link add pb$id type veth peer name bp$id
ip link set pa$id netns "$P"; ip link set ap$id netns "$A"
ip link set pb$id netns "$P"; ip link set bp$id netns "$B"
ip -n "$P" addr add 10.200.1.1/24 dev pa$id; ip -n "$A" addr add 10.200.1.2/24 dev ap$id
ip -n "$P" addr add 10.200.2.1/24 dev pb$id; ip -n "$B" addr add 10.200.2.2/24 dev bp$id
for l in "$P pa$id" "$P pb$id" "$A ap$id" "$B bp$id"; do set -- $l; ip -n "$1" link set "$2" up; done
ip -n "$A" route get 10.200.1.1 >/dev/null && ip -n "$B" route get 10.200.2.1 >/dev/null
# Separate stacks: A has no route to B's network, nor to anything outside.
if ip -n "$A" route get 10.200.2.2 >/dev/null 2>&1; then echo "A has a route to B?"; exit 1; fi

scripts/gen-test-certs.sh "$tmp/certs" >/dev/null
tokA=$(openssl rand -hex 32) tokB=$(openssl rand -hex 32) tokM=$(openssl rand -hex 32)
printf 'trainerA trainer %s\ntrainerB trainer %s\nmonitor reader %s\n' "$tokA" "$tokB" "$tokM" >"$tmp/tokens"
for t in A B M; do v=tok$t; printf '%s\n' "${!v}" >"$tmp/token$t"; done
chmod 600 "$tmp"/token*
c="$tmp/certs"
ip netns exec "$P" "$BUILD/bin/psd" --listen 0.0.0.0:50051 --log-level warn --set server.context_ttl_s=5 \
   --set security.tls=true --set security.cert="$c/server.pem" --set security.key="$c/server.key" \
   --set security.mutual_tls=true --set security.ca="$c/ca.pem" --set security.tokens_file="$tmp/tokens" \
   2>"$tmp/psd.log" &
psd=$!; pids+=("$psd")
client=(--set security.tls=true --set security.ca="$c/ca.pem" --set security.client_cert="$c/client.pem"
        --set security.client_key="$c/client.key")
status() {  # from B's side, with the read-only token
  ip netns exec "$B" "$BUILD/bin/ps-train" --server 10.200.2.1:50051 --status "${client[@]}" \
     --set security.token_file="$tmp/tokenM" --set trainer.rpc_timeout_s=5 2>/dev/null
}
for _ in $(seq 100); do status >/dev/null && break; sleep 0.1; done
status >/dev/null || { echo "psd not reachable from B"; cat "$tmp/psd.log"; exit 1; }

train=(--world-size 3 --data "$DATA" --max-batches "$BATCHES" --log-every 1 "${client[@]}"
       --set trainer.rpc_timeout_s=3 --set trainer.retry_max_s=120 --set trainer.retry_backoff_s=0.2
       --set trainer.retry_backoff_max_s=2)
ip netns exec "$A" "$BUILD/bin/ps-train" --server 10.200.1.1:50051 --rank 1 "${train[@]}" \
   --set security.token_file="$tmp/tokenA" >"$tmp/A.log" 2>&1 &
ta=$!; pids+=("$ta")
ip netns exec "$B" "$BUILD/bin/ps-train" --server 10.200.2.1:50051 --rank 2 "${train[@]}" \
   --set security.token_file="$tmp/tokenB" >"$tmp/B.log" 2>&1 &
tb=$!; pids+=("$tb")

for _ in $(seq 1200); do grep -q "training batch 10 " "$tmp/A.log" && break; sleep 0.05; done
grep -q "training batch 10 " "$tmp/A.log" || { echo "A did not start training"; cat "$tmp/A.log"; exit 1; }
bA=$(grep -c "training batch" "$tmp/A.log"); bB=$(grep -c "training batch" "$tmp/B.log")
echo "cutting A's link (A at batch $bA, B at batch $bB) for ${CUT_S}s"
ip -n "$A" link set ap$id down
sleep "$CUT_S"
bA2=$(grep -c "training batch" "$tmp/A.log"); bB2=$(grep -c "training batch" "$tmp/B.log")
ip -n "$A" link set ap$id up
echo "link back up; during the cut A went $bA -> $bA2 batches, B $bB -> $bB2"
live_mid=$(status | sed -n 's/^live_contexts: //p')

rc=0
wait "$ta" || rc=1
wait "$tb" || rc=1
for t in A B; do
  echo "--- trainer $t: $(grep -c 'retry [0-9]* in' "$tmp/$t.log") retries; $(grep -c 'training batch' "$tmp/$t.log") batches"
  grep -E "retry 1 in|giving up|running the batch again|RPC retries|Training complete|accuracy" "$tmp/$t.log" | head -n 5
done
[ $rc -eq 0 ] || { echo "a trainer failed"; tail -n 20 "$tmp/A.log" "$tmp/B.log"; exit 1; }
grep -q "retry [0-9]* in" "$tmp/A.log" || { echo "A never retried: was the link really cut?"; exit 1; }
! grep -q "retry [0-9]* in" "$tmp/B.log" || { echo "B retried although its link was never cut"; exit 1; }
[ "$bB2" -gt "$bB" ] || { echo "B made no progress while A's link was down"; exit 1; }
[ "$bA2" -le $(( bA + 1 )) ] || { echo "A trained while its link was down?"; exit 1; }
for _ in $(seq 100); do
  live=$(status | sed -n 's/^live_contexts: //p'); [ "$live" = 0 ] && break; sleep 0.2
done
s=$(status)
echo "psd after both trainers: $(echo "$s" | grep -E 'model_version|live_contexts|expired_contexts' | tr '\n' ' ') (live right after the cut: $live_mid)"
[ "$live" = 0 ] || { echo "live contexts did not return to 0"; exit 1; }
v=$(echo "$s" | sed -n 's/^model_version: //p')
[ "$v" -eq $(( 2 * BATCHES )) ] || { echo "model version $v, expected exactly $(( 2 * BATCHES )) steps (each batch once)"; exit 1; }
# A plaintext client from A is refused (non-loopback target without TLS).
if ip netns exec "$A" "$BUILD/bin/ps-train" --server 10.200.1.1:50051 --status >"$tmp/plain.log" 2>&1; then
  echo "plaintext status from A succeeded?"; exit 1; fi
echo "plaintext from A refused: $(head -c 160 "$tmp/plain.log")"
kill -TERM "$psd"; wait "$psd" 2>/dev/null || { echo "psd did not stop cleanly"; tail "$tmp/psd.log"; exit 1; }
echo "netns_link_cut: link cut ${CUT_S}s survived (A retried, B unaffected, every batch applied once, contexts 0): OK"
