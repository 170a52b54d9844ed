#!/usr/bin/env bash
# Integration: psd's admission refusals are backed off and sent again, and
# every batch is still applied exactly once (docs/protocol.md, "Statuses").
# Without tokens a client is its host, so two trainers on loopback share
# one fair share of psd's calls and context memory:
#  1. server.max_calls_per_client 1: two ps-train (three calls a batch,
#     --split-calls) are refused RESOURCE_EXHAUSTED "too many calls from
#     one client" whenever their calls overlap;
#  2. server.max_context_bytes for one batch's context: two ps-train (one
#     call a batch: a fused Forward with step) are refused for context
#     memory whenever their batches overlap;
#  3. both limits at once: two Python trainers (python/psd,
#     tests/python/fault_trainer.py).
# Each run: every trainer exits 0, some call was refused and sent again
# (the log's "RESOURCE_EXHAUSTED ...; retry N in"), and the fresh psd's
# Status.contexts_applied equals the batches the trainers ran (none twice,
# none lost), no context left open. Then what stays final: a context larger
# than the whole budget gives up at once (ps-train, before any retry),
# and a message over server.max_message_mb (Python; no hint) is refused
# at the first try. Then, through tests/slow_proxy.py (a client that looks
# slow: its request messages held): a stalled call psd ends past
# server.max_stalled_per_client carries psd-retry-after-ms and is sent again
# (grpcio, python/psd); contexts a trainer abandons are released
# (ReleaseContext: python/psd under room for one context, and ps-train's
# batch run again when its Backward is held past its deadline).
. "$(dirname "$0")/lib.sh" it_busy
. tests/python/lib.sh
DATA=${DATA:-data/mnist}
BATCHES=${BATCHES:-16}
status() { "$BUILD/bin/ps-train" --server "$addr" --status --set trainer.rpc_timeout_s=5 2>/dev/null; }
field() { sed -n "s/^$1: //p"; }
retry=(--set trainer.rpc_timeout_s=10 --set trainer.retry_max_s=60 --set trainer.retry_backoff_s=0.05
       --set trainer.retry_backoff_max_s=0.5)
# One mnist batch of 64 records a context of ~11.3 MB: room for one, not two.
ONE_CTX=16000000

# run NAME PSD_ARGS -- TRAINER...: psd with PSD_ARGS, two trainers (ranks 1, 2) running TRAINER (with
# --rank R appended by the caller's words), then the equality.
check_once() {  # name
  local name=$1 s c live r n=0
  local m s1
  for r in 1 2; do
    grep -q "Training complete!\|fault_trainer: $BATCHES batches" "$tmp/$name$r.log" || fail "$name: trainer $r did not finish"
    m=$(grep -c "RESOURCE_EXHAUSTED.*; retry [0-9]* in" "$tmp/$name$r.log" || true)
    n=$(( n + m ))
    if grep -q "Training complete!" "$tmp/$name$r.log"; then  # ps-train's summary counts them
      s1=$(sed -n "s/^Rank $r: \([0-9]*\) calls sent again after psd's admission refusals$/\1/p" "$tmp/$name$r.log")
      [ "${s1:-0}" = "$m" ] || fail "$name: trainer $r logged $m admission retries, its summary says ${s1:-none}"
    fi
  done
  s=$(status); c=$(echo "$s" | field contexts_applied); live=$(echo "$s" | field live_contexts)
  echo "$name: 2 trainers x $BATCHES batches: $n admission refusals sent again; contexts_applied $c, live $live"
  [ "$n" -gt 0 ] || fail "$name: no call was refused: the limits did not bite"
  [ "$c" = $(( 2 * BATCHES )) ] || fail "$name: contexts_applied $c, the trainers ran $(( 2 * BATCHES )) batches"
  [ "$live" = 0 ] || fail "$name: $live contexts left open"
  kill "$psd"; wait "$psd" 2>/dev/null || true
}

two_c() {  # name psd-args... : two ps-train with TRAINER_ARGS
  local name=$1; shift
  start_psd "$tmp/psd_$name.log" --log-level error "$@" || fail "psd"
  pids+=("$psd")
  local r t=()
  for r in 1 2; do
    "$BUILD/bin/ps-train" --server "$addr" --rank "$r" --world-size 3 --data "$DATA" --max-batches "$BATCHES" \
        --log-every 1 --no-eval "${retry[@]}" ${TRAINER_ARGS:-} >"$tmp/$name$r.log" 2>&1 &
    t+=("$!"); pids+=("$!")
  done
  for r in 0 1; do wait "${t[r]}" || fail "$name: trainer $(( r + 1 )) failed"; done
  check_once "$name"
}

TRAINER_ARGS=--split-calls two_c calls --set server.max_calls_per_client=1
TRAINER_ARGS= two_c memory --set server.max_context_bytes=$ONE_CTX

# A context larger than the whole budget can never be admitted: refused without the hint, final at once.
start_psd "$tmp/psd_huge.log" --log-level error --set server.max_context_bytes=4000000 || fail "psd"
pids+=("$psd")
if "$BUILD/bin/ps-train" --server "$addr" --data "$DATA" --max-batches 2 --no-eval "${retry[@]}" \
    >"$tmp/huge.log" 2>&1; then fail "a batch larger than server.max_context_bytes was trained"; fi
grep -q "RESOURCE_EXHAUSTED: context memory budget" "$tmp/huge.log" || fail "huge: not refused for context memory"
grep -q "retry [0-9]* in" "$tmp/huge.log" && fail "huge: a context that can never fit was retried"
kill "$psd"; wait "$psd" 2>/dev/null || true
echo "huge: a batch larger than server.max_context_bytes refused at once (final)"

# The Python package: both limits at once.
if ! $PY -c "import grpc, torch, yaml, numpy" 2>/dev/null || [ ! -f python/psd/_proto/ps_pb2_grpc.py ]; then
  echo "it_busy: Python part skipped (python3 modules or python/psd/_proto missing)"; exit 0
fi
name=py
start_psd "$tmp/psd_py.log" --log-level error --set server.max_calls_per_client=1 \
    --set server.max_context_bytes=$ONE_CTX || fail "psd"
pids+=("$psd")
t=()
for r in 1 2; do
  $PY tests/python/fault_trainer.py "$addr" "$DATA" "$BATCHES" --rank "$r" trainer.rpc_timeout_s=10 \
      trainer.retry_max_s=60 trainer.retry_backoff_s=0.05 trainer.retry_backoff_max_s=0.5 >"$tmp/py$r.log" 2>&1 &
  t+=("$!"); pids+=("$!")
done
for r in 0 1; do wait "${t[r]}" || fail "py: trainer $(( r + 1 )) failed"; done
check_once py

# A message over psd's server.max_message_mb carries no hint: final at the first try.
start_psd "$tmp/psd_big.log" --log-level error --set server.max_message_mb=4 || fail "psd"
pids+=("$psd")
$PY - "$addr" >"$tmp/big.log" 2>&1 <<'EOF' || fail "big: $(tail -n 3 "$tmp/big.log")"
import sys, time
import torch
import psd
from psd._proto import ps_pb2
from psd.tensors import to_wire
client = psd.connect(sys.argv[1], overrides={"server.max_message_mb": "64", "trainer.retry_max_s": "30"})
req = ps_pb2.ForwardRequest(input=to_wire(torch.zeros(2000, 1, 28, 28)))   # 6.3 MB
t0 = time.monotonic()
try:
    client.conns[0].call("Forward", req)
    sys.exit("a 6.3 MB Forward passed psd's 4 MiB limit")
except psd.Error as e:
    dt = time.monotonic() - t0
    assert e.status == "RESOURCE_EXHAUSTED" and not e.busy, e
    assert client.retries == 0 and dt < 5, (client.retries, dt)
    print(f"big: {e} - final after {dt:.2f} s, no retry")
EOF
cat "$tmp/big.log"

# A slow client's stalled calls (tests/slow_proxy.py holds the request messages of its first two
# calls 2.5 s, as a GC pause would): past the stall grace (1 s) the second is over
# server.max_stalled_per_client (1) and psd ends it RESOURCE_EXHAUSTED with psd-retry-after-ms (it
# read nothing of it), so grpcio sees the hint and the Python package sends it again and succeeds;
# psd used to cancel it without the hint, final for both clients.
start_psd "$tmp/psd_stall.log" --log-level warn --set server.max_stalled_per_client=1 \
    --set server.recv_timeout_s=10 || fail "psd"
pids+=("$psd")
stall_run() {  # raw|psd: slow_proxy in front of psd, then the Python check through it
  local pp port
  coproc PROXY { exec $PY tests/slow_proxy.py "${addr##*:}" 2 2.5 --on-signal; }
  pp=$PROXY_PID; pids+=("$pp")
  read -r -t 10 port <&"${PROXY[0]}" || fail "stall: slow_proxy did not start"
  $PY - "127.0.0.1:$port" "$1" "$pp" >"$tmp/stall_$1.log" 2>&1 <<'EOF' || fail "stall $1: $(tail -n 5 "$tmp/stall_$1.log")"
import os, signal, sys, time
from concurrent import futures
import grpc
import psd
from psd._proto import ps_pb2, ps_pb2_grpc
addr, what, proxy = sys.argv[1], sys.argv[2], int(sys.argv[3])
req = ps_pb2.ListParametersRequest()
def hold_next_two():   # after the client's own set-up calls
    os.kill(proxy, signal.SIGUSR1)
    time.sleep(0.3)
if what == "raw":   # grpcio alone: the status and the trailing metadata
    stub = ps_pb2_grpc.ParameterServerStub(grpc.insecure_channel(addr))
    hold_next_two()
    calls = [stub.ListParameters.future(req, timeout=20) for _ in range(2)]
    ok, refused = 0, []
    for f in calls:
        try:
            f.result()
            ok += 1
        except grpc.RpcError as e:
            refused.append(e)
    assert ok == 1 and len(refused) == 1, (ok, [(e.code(), e.details()) for e in refused])
    e = refused[0]
    hint = dict(e.trailing_metadata() or ()).get("psd-retry-after-ms")
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "not received" in e.details(), (e.code(), e.details())
    assert hint == "1000", f"no retry hint on the stalled call psd ended: trailing metadata {e.trailing_metadata()}"
    print(f"stall raw: 1 answered, 1 ended {e.code().name} ({e.details()[:60]}...) with psd-retry-after-ms {hint}")
else:               # the Python package: sent again after the hint, both answered
    client = psd.connect(addr, overrides={"trainer.retry_max_s": "30", "trainer.retry_backoff_s": "0.05"})
    hold_next_two()
    t0 = time.monotonic()
    with futures.ThreadPoolExecutor(2) as ex:
        res = list(ex.map(lambda _: client.conns[0].call("ListParameters", req), range(2)))
    dt = time.monotonic() - t0
    assert all(len(r.parameters) > 0 for r in res) and client.retries >= 1, (client.retries, dt)
    print(f"stall psd: both calls answered in {dt:.1f} s, {client.retries} sent again after psd's hint")
EOF
  cat "$tmp/stall_$1.log"
  kill "$pp" 2>/dev/null; wait "$pp" 2>/dev/null || true
}
stall_run raw
stall_run psd
grep -aq "cancelled 1 call that stalled" "$tmp/psd_stall.log" || fail "stall: psd did not end a stalled call"
kill "$psd"; wait "$psd" 2>/dev/null || true

# A context the trainer abandons (an exception, a lost batch run again) is released at once
# (ReleaseContext), not held until server.context_ttl_s: with room for one batch's context (25 MB:
# a Forward of 64 is admitted 17.7 MB, then holds 11.3), the next batch's Forward is admitted at
# once - without the release it is refused for the client's own abandoned context (its share)
# until the TTL, and the trainer starves itself.
start_psd "$tmp/psd_rel.log" --log-level error --set server.max_context_bytes=25000000 || fail "psd"
pids+=("$psd")
$PY - "$addr" >"$tmp/rel.log" 2>&1 <<'EOF' || fail "release: $(tail -n 5 "$tmp/rel.log")"
import sys
import torch
import psd
from psd._proto import ps_pb2
from psd.context import Context
from psd.tensors import to_wire
client = psd.connect(sys.argv[1], overrides={"trainer.retry_max_s": "5", "trainer.retry_backoff_s": "0.05"})
conn = client.conns[0]
def forward(ctx):   # one training Forward of a batch of 64 (a context of ~11 MB)
    ctx.forward_part(conn, ps_pb2.ForwardRequest(input=to_wire(torch.rand(64, 1, 28, 28))), ctx.new_record("mnist"))
ids = []
for i in range(3):
    try:
        with Context(client) as ctx:
            ids.append(ctx.id)
            forward(ctx)
            raise RuntimeError("the trainer's own error: the batch is abandoned")
    except RuntimeError:
        pass
st = conn.call("Status", ps_pb2.StatusRequest())
assert client.retries == 0, f"{client.retries} Forwards refused for the client's own abandoned contexts"
assert client.released == 3 and st.contexts_released == 3 and st.live_contexts == 0, (client.released, st)
print(f"release: 3 abandoned contexts of ~11 MB (17.7 MB admitted for each Forward) under a 25 MB budget released at once (contexts_released "
      f"{st.contexts_released}, live {st.live_contexts}), no Forward refused")
EOF
cat "$tmp/rel.log"
kill "$psd"; wait "$psd" 2>/dev/null || true
# ps-train (--split-calls) whose first Backward is held by tests/slow_proxy.py past its deadline
# (trainer.rpc_timeout_s 1): rule 5 runs the batch again under a fresh id and releases the abandoned
# context (its Forward is recorded on psd) - psd ends with no live context, one released, and every
# batch applied once; before ReleaseContext it stayed live until server.context_ttl_s.
start_psd "$tmp/psd_crel.log" --log-level error || fail "psd"
pids+=("$psd")
coproc PROXY { exec $PY tests/slow_proxy.py "${addr##*:}" 1 2.5 --skip 2; }  # ListParameters, Forward pass
pp=$PROXY_PID; pids+=("$pp")
read -r -t 10 port <&"${PROXY[0]}" || fail "crel: slow_proxy did not start"
"$BUILD/bin/ps-train" --server "127.0.0.1:$port" --rank 1 --data "$DATA" --max-batches 4 --no-eval --split-calls \
    --log-every 1 --set trainer.rpc_timeout_s=1 --set trainer.retry_backoff_s=0.05 >"$tmp/crel.log" 2>&1 ||
  fail "crel: ps-train failed: $(tail -n 3 "$tmp/crel.log")"
grep -q "left unstepped (no Step was sent) and released; running the batch again" "$tmp/crel.log" ||
  fail "crel: the held Backward did not make ps-train run the batch again and release its context"
s=$(status)
c=$(echo "$s" | field contexts_applied); live=$(echo "$s" | field live_contexts); rel=$(echo "$s" | field contexts_released)
echo "crel: ps-train's Backward held past its deadline: batch run again, its first context released; contexts_applied $c, live $live, released $rel"
[ "$c" = 4 ] && [ "$live" = 0 ] && [ "$rel" = 1 ] || fail "crel: contexts_applied $c (4 batches), live $live (0), released $rel (1)"
kill "$pp" "$psd"; wait "$psd" 2>/dev/null || true
echo "it_busy: admission refusals backed off and sent again, each batch applied once (C and Python); too large stays final: OK"
