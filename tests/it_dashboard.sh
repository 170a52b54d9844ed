#!/usr/bin/env bash
# Integration: the dashboard's server side (server/dashboard.c) from outside,
# without a browser (tests/it_dashboard_browser.sh drives the page):
#  1. psd + two MNIST trainers (one call a batch, ps-train's default, and
#     --fuse-step's Forward + Backward(step)): /api/dashboard agrees
#     with `ps-train status` (model, version, samples, trainers seen) and
#     with what each trainer printed (samples, batches); integrating the
#     history's samples/s and steps/s over its points gives exactly the
#     samples and steps trained; the trainers' Step scalar `loss` is charted,
#     and psd's fused loss of the one-call trainer, with the unit still
#     samples (a classifier's cross-entropy is not a perplexity);
#     ?since= returns only new points;
#  2. the page and its files are compiled in (HTML with its CSP, the chart
#     library and its MIT licence), other paths are 404, POST is refused;
#  3. a connection cap per client address (server.max_calls_per_client)
#     holds on the HTTP port too; a slowloris (headers trickled a byte at a
#     time) from four addresses that fill the whole cap is closed at the
#     request bound (server.recv_timeout_s) and an operator is answered;
#  4. server.metrics_tls: HTTPS with security.cert (verified against the
#     test CA), plain HTTP refused there; --check-config refuses it without
#     a certificate;
#  5. rnn_lm: the dashboard reports tokens and perplexity.
. "$(dirname "$0")/lib.sh" it_dashboard
DATA=${DATA:-data/mnist}
[ -e "$DATA/train-images-idx3-ubyte" ] || { echo "it_dashboard: skipped: no MNIST in $DATA"; exit 77; }
command -v openssl >/dev/null || { echo "it_dashboard: skipped: openssl not installed"; exit 77; }
BATCHES=40

# ---- 1. values against Status and the trainers -----------------------------
port=$(free_port); mport=$((port + 1))
"$BUILD/bin/psd" --listen "127.0.0.1:$port" --metrics-listen "127.0.0.1:$mport" \
  --set server.max_calls=16 2>"$tmp/psd.log" &
psd=$!; pids+=("$psd")
wait_port "$mport" || fail "psd's metrics port"
"$BUILD/bin/ps-train" --server "127.0.0.1:$port" --rank 1 --world-size 3 --data "$DATA" --max-batches $BATCHES \
  --no-eval >"$tmp/rank1.log" 2>&1 &
t1=$!; pids+=("$t1")
"$BUILD/bin/ps-train" --server "127.0.0.1:$port" --rank 2 --world-size 3 --data "$DATA" --max-batches $BATCHES \
  --fuse-step --no-eval >"$tmp/rank2.log" 2>&1 || fail "trainer 2"
wait "$t1" || fail "trainer 1"
"$BUILD/bin/ps-train" status --server "127.0.0.1:$port" >"$tmp/status.txt" 2>&1 || fail "ps-train status"
sleep 2.5   # two more history points: the last batches are in a closed point
$PY - "$tmp" "$mport" "$BATCHES" "$psd" <<'PYEOF' || fail "the dashboard's JSON"
import json, math, re, sys, urllib.request
tmp, mport, batches, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
base = f"http://127.0.0.1:{mport}"
def get(path):
    with urllib.request.urlopen(base + path, timeout=10) as r:
        return r.status, dict(r.headers), r.read()
def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        sys.exit(1)
s = open(f"{tmp}/status.txt").read()
m = re.search(r"model\s+(\S+), version (\d+)", s)
model, version = m.group(1), int(m.group(2))
samples = int(re.search(r"samples\s+(\d+) trained", s).group(1))
seen = int(re.search(r"trainers seen\s+(\d+)", s).group(1))
st, hd, body = get("/api/dashboard")
d = json.loads(body)
check(st == 200 and hd["Content-Type"].startswith("application/json"), "GET /api/dashboard: JSON")
rss = int(re.search(r"VmRSS:\s+(\d+) kB", open(f"/proc/{pid}/status").read()).group(1)) * 1024
p = d["psd"]
check(abs(p.get("rss_bytes", -1) - rss) <= 0.25 * rss and p.get("cpu_s", 0) > 0,
      f"psd's resident memory {p.get('rss_bytes', -1) / 1e6:.1f} MB (its VmRSS {rss / 1e6:.1f}), CPU {p.get('cpu_s')} s")
check(d["model"]["name"] == model and d["model"]["version"] == version, f"model {model} version {version}")
check(d["model"]["samples"] == samples, f"samples {d['model']['samples']} == Status {samples}")
check(d["contexts"]["trainers_seen"] == seen == 2, f"trainers seen {seen}")
check(d["model"]["unit"] == "samples" and not d["model"]["perplexity"], "MNIST: samples, no perplexity")
check(d["devices"].get("memory") == [], f"CPU stages: no GPU memory entries ({d['devices'].get('memory')})")
rows = {t["rank"]: t for t in d["trainers"]}
for r in (1, 2):
    own = int(re.search(rf"Rank {r}: (\d+) samples in", open(f"{tmp}/rank{r}.log").read()).group(1))
    t = rows.get(r)
    check(t is not None and t["samples"] == own and t["steps"] == batches and t["forwards"] == batches,
          f"rank {r}: samples {t and t['samples']} == its own {own}, steps {t and t['steps']} == {batches}")
    check(t["replayed_forwards"] == 0 and t["repeated_steps"] == 0 and 0 < t["loss"] < 5,
          f"rank {r}: no retries, loss {t['loss']:.4f}")
h = d["history"]
ser = {x["name"]: x for x in h["series"]}
check(h["full"] and len(h["t"]) == len(h["span"]) >= 2, f"history: {len(h['t'])} points of {h['interval_s']} s")
got = sum((v or 0) * sp for v, sp in zip(ser["samples"]["v"], h["span"]))
check(abs(got - samples) < 1e-6 * samples + 1e-3, f"integral of samples/s over the history {got:.3f} == {samples}")
got = sum((v or 0) * sp for v, sp in zip(ser["steps"]["v"], h["span"]))
check(abs(got - version) < 1e-6 * version + 1e-3, f"integral of steps/s {got:.3f} == model version {version}")
loss = [v for v in ser["scalar.loss"]["v"] if v is not None]
check(len(loss) >= 1 and all(0 < v < 5 for v in loss), f"the trainers' loss charted: {len(loss)} points")
fused = [v for v in ser["loss.fused"]["v"] if v is not None]
check(len(fused) >= 1 and all(0 < v < 5 for v in fused), f"psd's loss of the one-call trainer charted: {len(fused)} points")
check(any(x["name"] == "loss" for x in d["rounds"]["scalars"]), "round metrics hold the loss")
st, hd, body = get(f"/api/dashboard?since={h['gen']}.{h['next']}")
h2 = json.loads(body)["history"]
check(not h2["full"] and len(h2["t"]) <= 2, f"?since: only new points ({len(h2['t'])})")
st, hd, body = get("/api/dashboard?since=garbage")
check(json.loads(body)["history"]["full"], "?since=garbage: the whole history")
# ---- 2. the page and its files
st, hd, body = get("/")
check(st == 200 and hd["Content-Type"].startswith("text/html") and b"/dashboard.js" in body, "GET /: the page")
check("default-src 'self'" in hd.get("Content-Security-Policy", ""), "the page's CSP: its own files only")
for path, what in (("/dashboard.js", b"api/dashboard"), ("/uPlot.iife.min.js", b"uPlot"),
                   ("/uPlot.LICENSE.txt", b"MIT"), ("/dashboard.css", b"--bg"), ("/favicon.svg", b"<svg")):
    st, hd, body = get(path)
    check(st == 200 and what in body, f"GET {path}")
check(b"http://" not in get("/")[2].replace(b"http://www.w3.org", b""), "the page names no other host")
for path in ("/nope", "/api/dashboardx", "/../etc/passwd"):
    try:
        get(path); check(False, f"GET {path}")
    except urllib.error.HTTPError as e:
        check(e.code == 404, f"GET {path}: 404")
try:
    urllib.request.urlopen(urllib.request.Request(base + "/api/dashboard", data=b"x", method="POST"), timeout=10)
    check(False, "POST refused")
except urllib.error.HTTPError as e:
    check(e.code == 405, "POST /api/dashboard: 405 (read-only)")
PYEOF

# ---- 3. connections per client address: max_calls 16 -> 4 per client --------
$PY - "$mport" <<'PYEOF' || fail "the per-client connection cap"
import socket, sys, time, urllib.request
mport = int(sys.argv[1])
held = [socket.create_connection(("127.0.0.1", mport), timeout=5) for _ in range(4)]
time.sleep(0.3)
try:
    urllib.request.urlopen(f"http://127.0.0.1:{mport}/healthz", timeout=5).read()
    print("FAIL  a fifth connection from this address was served"); sys.exit(1)
except Exception as e:
    print(f"ok    a fifth connection from this address refused ({type(e).__name__})")
for s in held:
    s.close()
time.sleep(0.5)
ok = urllib.request.urlopen(f"http://127.0.0.1:{mport}/healthz", timeout=5).status == 200
print(("ok    " if ok else "FAIL  ") + "served again once they closed")
sys.exit(0 if ok else 1)
PYEOF
kill -TERM "$psd"; wait "$psd" || fail "psd's stop"

# ---- 3b. slowloris from 4 addresses x 4 connections = the whole cap (16) -----
port=$(free_port); mport=$((port + 1))
"$BUILD/bin/psd" --listen "127.0.0.1:$port" --metrics-listen "127.0.0.1:$mport" --set server.max_calls=16 \
  --set server.recv_timeout_s=2 --set server.send_timeout_s=2 2>"$tmp/psd-slow.log" &
psd=$!; pids+=("$psd")
wait_port "$mport" || fail "psd's metrics port (slowloris)"
$PY - "$mport" <<'PYEOF' || fail "a slowloris on the HTTP port"
import socket, sys, time, urllib.request
mport = int(sys.argv[1])
held = []
for a in range(2, 6):
    for _ in range(4):
        s = socket.create_connection(("127.0.0.1", mport), source_address=(f"127.0.0.{a}", 0), timeout=5)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-slow: ")
        held.append(s)
t0, answered, closed = time.monotonic(), 0, 0
while time.monotonic() - t0 < 10 and held:   # a byte every 0.5 s: never idle, never a whole request
    alive = []
    for s in held:
        try:
            s.sendall(b"a")
            alive.append(s)
        except OSError:
            closed += 1
            s.close()
    held = alive
    if not answered:
        try:
            answered = urllib.request.urlopen(f"http://127.0.0.1:{mport}/healthz", timeout=0.5).status == 200
        except Exception:
            pass
    time.sleep(0.5)
print(("ok    " if closed == 16 else "FAIL  ") + f"psd closed {closed} of 16 trickling connections")
print(("ok    " if answered else "FAIL  ") + "an operator was answered while they trickled")
m = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read().decode()
n = int(m.split("\npsd_http_connections_expired_total ")[1].split()[0])
print(("ok    " if n >= 16 else "FAIL  ") + f"psd_http_connections_expired_total {n}")
sys.exit(0 if closed == 16 and answered and n >= 16 else 1)
PYEOF
kill -TERM "$psd"; wait "$psd" || fail "psd's stop (slowloris)"

# ---- 4. HTTPS ------------------------------------------------------------------
scripts/gen-test-certs.sh "$tmp/c" >/dev/null
out=$("$BUILD/bin/psd" --check-config /dev/null --set server.metrics_tls=true 2>&1) && fail "--check-config accepted metrics_tls without a certificate"
<<<"$out" grep -q "server.metrics_tls is true but security.cert" || fail "--check-config's message: $out"
echo "ok    --check-config refuses server.metrics_tls without security.cert"
port=$(free_port); mport=$((port + 1))
"$BUILD/bin/psd" --listen "127.0.0.1:$port" --metrics-listen "127.0.0.1:$mport" --set server.metrics_tls=true \
  --set security.cert="$tmp/c/server.pem" --set security.key="$tmp/c/server.key" 2>"$tmp/psd-tls.log" &
psd=$!; pids+=("$psd")
wait_port "$mport" || fail "psd with metrics_tls"
$PY - "$mport" "$tmp/c/ca.pem" <<'PYEOF' || fail "HTTPS"
import json, ssl, sys, urllib.request
mport, ca = int(sys.argv[1]), sys.argv[2]
ctx = ssl.create_default_context(cafile=ca)
d = json.load(urllib.request.urlopen(f"https://localhost:{mport}/api/dashboard", context=ctx, timeout=10))
print("ok    HTTPS /api/dashboard, certificate verified: model " + d["model"]["name"])
try:
    urllib.request.urlopen(f"http://127.0.0.1:{mport}/healthz", timeout=5).read()
    print("FAIL  plain HTTP served on the HTTPS port"); sys.exit(1)
except Exception as e:
    print(f"ok    plain HTTP refused on the HTTPS port ({type(e).__name__})")
PYEOF
grep -q "dashboard on https://127.0.0.1:$mport/" "$tmp/psd-tls.log" || fail "psd's log names the https dashboard"
kill -TERM "$psd"; wait "$psd" || fail "psd's stop (TLS)"

# ---- 5. a token model: tokens and perplexity ----------------------------------------
port=$(free_port); mport=$((port + 1))
"$BUILD/bin/psd" --config configs/rnn_lm.yaml --listen "127.0.0.1:$port" --metrics-listen "127.0.0.1:$mport" \
  2>"$tmp/psd-lm.log" &
psd=$!; pids+=("$psd")
wait_port "$mport" || fail "psd rnn_lm"
$PY - "$mport" <<'PYEOF' || fail "rnn_lm's dashboard"
import json, sys, urllib.request
d = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/api/dashboard", timeout=10))
m = d["model"]
ok = m["name"] == "rnn_lm" and m["unit"] == "tokens" and m["perplexity"] and [s["name"] for s in m["stages"]] == ["emb", "decoder", "rnn"]
print(("ok    " if ok else "FAIL  ") + f"rnn_lm: unit {m['unit']}, perplexity {m['perplexity']}, stages {[s['name'] for s in m['stages']]}")
sys.exit(0 if ok else 1)
PYEOF
kill -TERM "$psd"; wait "$psd" || fail "psd's stop (rnn_lm)"
echo "it_dashboard: OK"
