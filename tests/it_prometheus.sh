#!/usr/bin/env bash
# Integration: a real Prometheus (Debian's `prometheus`) started on loopback
# scrapes psd's /metrics; the test reads the psd_* series back through
# Prometheus's HTTP API and compares them with what it made psd do:
#  - up{job="psd"} == 1 (Prometheus parsed the page);
#  - psd_model_version == the batches ps-train trained (5);
#  - psd_serving == 1, psd_calls_refused_total{reason="auth"} counted the
#    calls made without a token;
#  - the phase accounting (server.profile, on by default) counted the 5
#    Forwards (one call a batch: no Backward or Step), timed their compute,
#    and its phases fit in each method's span.
#  - the standard process_* series against the kernel's own accounts of
#    psd's process read by this test beside the scrape (/proc/PID: VmRSS,
#    utime + stime, the fd directory, the fd limit, the start time):
#    resident memory within 25 %, CPU within 0.5 s, descriptors within 4,
#    the limit equal, the start within 5 s of when the test launched psd;
#    and through Prometheus.
. "$(dirname "$0")/lib.sh" it_prometheus
DATA=${DATA:-data/mnist}
command -v prometheus >/dev/null || { echo "it_prometheus: skipped: prometheus not installed (scripts/install-deps.sh)"; exit 77; }
command -v openssl >/dev/null || { echo "it_prometheus: skipped: openssl not installed"; exit 77; }
[ -e "$DATA/train-images-idx3-ubyte" ] || { echo "it_prometheus: skipped: no MNIST in $DATA"; exit 77; }

port=$(free_port); mport=$((port + 1)); pport=$((port + 2))
tok=$(openssl rand -hex 32)
printf 'trainer1 trainer %s\n' "$tok" >"$tmp/tokens"; chmod 600 "$tmp/tokens"
printf '%s\n' "$tok" >"$tmp/tok"; chmod 600 "$tmp/tok"
launched=$(date +%s)
"$BUILD/bin/psd" --listen "127.0.0.1:$port" --set server.metrics_listen="127.0.0.1:$mport" \
  --set security.tokens_file="$tmp/tokens" 2>"$tmp/psd.log" &
psd=$!; pids+=("$psd")
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$mport) 2>/dev/null && break; sleep 0.1; done
"$BUILD/bin/ps-train" --server "127.0.0.1:$port" --set security.token_file="$tmp/tok" --data "$DATA" \
  --max-batches 5 --log-every 5 >"$tmp/train.log" 2>&1 || fail "ps-train"
for _ in 1 2 3; do "$BUILD/bin/ps-train" --server "127.0.0.1:$port" --status >/dev/null 2>&1 || true; done
curl -sf "http://127.0.0.1:$mport/metrics" >"$tmp/metrics.txt" || fail "/metrics"
# psd's own accounts, read right after the scrape (psd re-executes itself: the same pid)
{ grep VmRSS "/proc/$psd/status"; echo "stat $(cat "/proc/$psd/stat")"; echo "fds $(ls "/proc/$psd/fd" | wc -l)";
  grep 'Max open files' "/proc/$psd/limits"; echo "clk $(getconf CLK_TCK)"; echo "launched $launched"; } >"$tmp/proc.txt"
$PY - "$tmp/metrics.txt" "$tmp/proc.txt" <<'PYEOF' || fail "process_* series against /proc"
import re, sys
met = {}
for line in open(sys.argv[1]):
    m = re.match(r"(process_\w+) (\S+)$", line)
    if m: met[m.group(1)] = float(m.group(2))
proc = open(sys.argv[2]).read()
rss = int(re.search(r"VmRSS:\s+(\d+) kB", proc).group(1)) * 1024
stat = re.search(r"^stat (.*)$", proc, re.M).group(1)
fields = stat[stat.rindex(")") + 2:].split()   # from field 3 (state) on
clk = int(re.search(r"^clk (\d+)", proc, re.M).group(1))
cpu = (int(fields[14 - 3]) + int(fields[15 - 3])) / clk
fds = int(re.search(r"^fds (\d+)", proc, re.M).group(1))
limit = int(re.search(r"Max open files\s+(\d+)", proc).group(1))
launched = int(re.search(r"^launched (\d+)", proc, re.M).group(1))
want = ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes",
        "process_start_time_seconds", "process_open_fds", "process_max_fds")
assert all(k in met for k in want), sorted(met)
assert abs(met["process_resident_memory_bytes"] - rss) <= 0.25 * rss, (met["process_resident_memory_bytes"], rss)
assert met["process_virtual_memory_bytes"] >= met["process_resident_memory_bytes"], met
assert 0 < met["process_cpu_seconds_total"] <= cpu + 0.01 and cpu - met["process_cpu_seconds_total"] <= 0.5, (met, cpu)
assert abs(met["process_open_fds"] - fds) <= 4, (met["process_open_fds"], fds)
assert met["process_max_fds"] == limit, (met["process_max_fds"], limit)
assert abs(met["process_start_time_seconds"] - launched) <= 5, (met["process_start_time_seconds"], launched)
print("ok: process_* series: resident %.1f MB (VmRSS %.1f), CPU %.2f s (%.2f), %d fds (%d) of %d, started %+.1f s "
      "after the launch" % (met["process_resident_memory_bytes"] / 1e6, rss / 1e6, met["process_cpu_seconds_total"],
                            cpu, met["process_open_fds"], fds, limit, met["process_start_time_seconds"] - launched))
PYEOF
$PY - "$tmp/metrics.txt" <<'PYEOF' || fail "phase accounting (psd_call_phase_*)"
import re, sys
ph, calls = {}, {}
for line in open(sys.argv[1]):
    m = re.match(r'psd_call_phase_seconds_total\{method="(\w+)",phase="(\w+)"\} (\S+)', line)
    if m: ph.setdefault(m.group(1), {})[m.group(2)] = float(m.group(3))
    m = re.match(r'psd_call_phase_calls_total\{method="(\w+)"\} (\S+)', line)
    if m: calls[m.group(1)] = float(m.group(2))
# ps-train's default is one call a batch: the Forwards carry the backward
# and the step (their compute), and no Backward or Step is sent
assert calls.get("Forward", 0) >= 5 and calls.get("Backward", 0) == 0 and calls.get("Step", 0) == 0, calls
assert ph["Forward"]["compute"] > 0, ph
for meth, p in ph.items():
    inside = sum(v for k, v in p.items() if k not in ("span", "held"))
    assert inside <= p["span"] * 1.001 + 1e-6, (meth, inside, p["span"])
print("ok: phases of %d Forwards: compute %.1f ms of %.1f ms in psd" % (calls["Forward"], 1e3 * ph["Forward"]["compute"],
                                                                      1e3 * ph["Forward"]["span"]))
PYEOF

cat >"$tmp/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: psd
    static_configs:
      - targets: ["127.0.0.1:$mport"]
YML
prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/tsdb" \
  --web.listen-address="127.0.0.1:$pport" >"$tmp/prometheus.log" 2>&1 &
pids+=($!)

query() {  # PromQL -> the first sample's value, or "" (bounded: 5 s per query)
  $PY - "$pport" "$1" <<'PYEOF'
import json, sys, urllib.parse, urllib.request
port, q = sys.argv[1], sys.argv[2]
try:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    r = json.load(urllib.request.urlopen(url, timeout=5))
    res = r["data"]["result"]
    print(res[0]["value"][1] if res else "")
except Exception:
    print("")
PYEOF
}
up=""
for _ in $(seq 60); do
  up=$(query 'up{job="psd"}')
  [ "$up" = 1 ] && [ -n "$(query psd_model_version)" ] && break
  sleep 0.5
done
[ "$up" = 1 ] || fail "Prometheus did not scrape psd (up=$up)"
v=$(query psd_model_version)
[ "$v" = 5 ] || fail "psd_model_version through Prometheus is '$v', expected 5"
s=$(query psd_serving)
[ "$s" = 1 ] || fail "psd_serving through Prometheus is '$s'"
a=$(query 'psd_calls_refused_total{reason="auth"}')
[ -n "$a" ] && [ "${a%.*}" -ge 3 ] || fail "psd_calls_refused_total{reason=\"auth\"} is '$a', expected >= 3"
# 5 training batches of 64 images (1x28x28 float32 = 3136 bytes each) went to psd's Forward
rb=$(query 'psd_message_bytes_total{dir="received"}'); sb=$(query 'psd_message_bytes_total{dir="sent"}')
[ -n "$rb" ] && [ "${rb%.*}" -ge $((5 * 64 * 3136)) ] || fail "psd_message_bytes_total{dir=\"received\"} is '$rb', expected >= $((5 * 64 * 3136))"
[ -n "$sb" ] && [ "${sb%.*}" -gt 0 ] || fail "psd_message_bytes_total{dir=\"sent\"} is '$sb'"
r=$(query 'process_resident_memory_bytes{job="psd"}')
[ -n "$r" ] && [ "${r%.*}" -gt $((8 << 20)) ] || fail "process_resident_memory_bytes through Prometheus is '$r'"
n=$(query 'count({__name__=~"psd_.+"})')
echo "ok: Prometheus $(prometheus --version 2>&1 | head -n 1 | awk '{print $3}') scraped psd: up=1, psd_model_version=$v, psd_serving=$s, refused (auth)=$a, message bytes in/out $rb/$sb, resident $r bytes, $n psd_* series"
kill -TERM "$psd"; wait "$psd" || fail "psd did not stop cleanly"
pids=()  # stopped above: nothing left to kill
echo "it_prometheus: a real Prometheus scrapes psd and serves its psd_* series: OK"
