#!/usr/bin/env bash
# Integration: keys that bound each other, and cluster addresses, read the
# same in C (psd --check-config, ps-train) and Python (psd.connect's config):
#  - trainer.retry_backoff_s above trainer.retry_backoff_max_s is refused by
#    all three naming both keys (equal is fine);
#  - servers.<name>.address may be unix:PATH as server.address may: two psd
#    of one cluster on one host, each on its own unix socket, pass
#    --check-config, start, and are dialled by ps-train status and by
#    psd.connect; one socket for two servers (written two ways) is refused
#    by psd --check-config and psd.connect alike.
. "$(dirname "$0")/lib.sh" it_py_config
. tests/python/lib.sh
py_require it_py_config
cfg=configs/cluster-mnist.yaml

# retry_backoff_s > retry_backoff_max_s: one message, three readers
want="trainer.retry_backoff_s: 20 is larger than trainer.retry_backoff_max_s (10)"
"$BUILD/bin/psd" --check-config "$cfg" --set trainer.retry_backoff_s=20 >"$tmp/c.out" 2>&1 && fail "psd took it"
grep -qF "psd: $cfg: $want" "$tmp/c.out" || { cat "$tmp/c.out"; fail "psd --check-config: expected '$want'"; }
"$BUILD/bin/ps-train" --config "$cfg" --set trainer.retry_backoff_s=20 --max-batches 1 >"$tmp/t.out" 2>&1 &&
  fail "ps-train took it"
grep -qF "ps-train: $cfg: $want" "$tmp/t.out" || { cat "$tmp/t.out"; fail "ps-train: expected '$want'"; }
$PY - "$cfg" "$want" <<'PYEOF' || fail "psd.connect's config"
import sys, grpc
from psd import config, errors
cfg, want = sys.argv[1:]
try:
    config.load(cfg, overrides={"trainer.retry_backoff_s": 20})
    sys.exit("accepted")
except errors.Error as e:
    assert e.code == grpc.StatusCode.INVALID_ARGUMENT and f"{cfg}: {want}" in e.details, e.details
c = config.load(cfg, overrides={"trainer.retry_backoff_s": 10})   # equal: fine
assert c.retry_backoff_s == c.retry_backoff_max_s == 10
PYEOF
"$BUILD/bin/psd" --check-config "$cfg" --set trainer.retry_backoff_s=10 >"$tmp/c.out" 2>&1 ||
  { cat "$tmp/c.out"; fail "psd refused retry_backoff_s = retry_backoff_max_s"; }
echo "ok: retry_backoff_s above retry_backoff_max_s refused alike by psd, ps-train and Python: $want"

# two psd of one cluster on unix sockets
u=(--set "servers.ps0.address=unix:$tmp/ps0.sock" --set "servers.ps1.address=unix://$tmp/ps1.sock")
"$BUILD/bin/psd" --check-config "$cfg" "${u[@]}" >"$tmp/c.out" 2>&1 || { cat "$tmp/c.out"; fail "unix cluster refused"; }
for s in ps0 ps1; do
  "$BUILD/bin/psd" --config "$cfg" --name $s "${u[@]}" --set server.compute_threads=1 2>"$tmp/$s.log" &
  pids+=($!)
done
for s in ps0 ps1; do
  for _ in $(seq 200); do [ -S "$tmp/$s.sock" ] && break; sleep 0.1; done
  [ -S "$tmp/$s.sock" ] || { cat "$tmp/$s.log"; fail "psd --name $s made no socket $tmp/$s.sock"; }
done
"$BUILD/bin/ps-train" status --config "$cfg" "${u[@]}" >"$tmp/st.out" 2>&1 || { cat "$tmp/st.out"; fail "ps-train status"; }
[ "$(grep -c "unix:" "$tmp/st.out")" = 2 ] && ! grep -q UNREACHABLE "$tmp/st.out" || { cat "$tmp/st.out"; fail "status"; }
$PY - "$cfg" "$tmp" <<'PYEOF' || fail "psd.connect over unix sockets"
import sys, grpc, psd
from psd import config, errors
cfg, tmp = sys.argv[1:]
ov = {"servers.ps0.address": f"unix:{tmp}/ps0.sock", "servers.ps1.address": f"unix://{tmp}/ps1.sock"}
c = psd.connect(cfg, overrides=ov, wait_s=20)
c.close()
try:
    config.load(cfg, overrides={"servers.ps0.address": f"unix:{tmp}//ps0.sock",
                                "servers.ps1.address": f"unix://{tmp}/./ps0.sock"})
    sys.exit("one socket for two servers accepted")
except errors.Error as e:
    assert "servers.ps1.address: " in e.details and "is also servers.ps0's address" in e.details, e.details
PYEOF
"$BUILD/bin/psd" --check-config "$cfg" --set "servers.ps0.address=unix:$tmp//ps0.sock" \
  --set "servers.ps1.address=unix://$tmp/./ps0.sock" >"$tmp/c.out" 2>&1 && fail "one socket for two servers passed"
grep -q "servers.ps1.address: 'unix://$tmp/./ps0.sock' is also servers.ps0's address" "$tmp/c.out" ||
  { cat "$tmp/c.out"; fail "one socket for two servers: message"; }
kill -TERM "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true; pids=()
echo "ok: a cluster on unix sockets passes --check-config, starts, and ps-train status and psd.connect dial it;" \
     "one socket for two servers refused alike"
echo "it_py_config: C and Python agree on retry backoffs and unix cluster addresses: OK"
