#!/usr/bin/env bash
# Integration: psd's web dashboard in a real browser (Debian's Chromium,
# driven by playwright-core from tests/browser/, which downloads no browser).
# psd with a checkpoint directory and two MNIST trainers; while they train
# the page must redraw its charts with new points; once they are done its
# values must equal `ps-train status` (model, version, samples, trainers
# seen, live contexts, last checkpoint) and, per rank, the samples and
# batches each trainer printed itself. Every request must go to psd (every
# other host is unresolvable), none may fail, no script error. Saves a
# screenshot: SCREENSHOT=docs/img/dashboard.png refreshes the README's.
# Skipped (exit 77) only when Chromium is missing or cannot start.
. "$(dirname "$0")/lib.sh" it_dashboard_browser
DATA=${DATA:-data/mnist}
BATCHES=${BATCHES:-80}
[ -x /usr/bin/chromium ] || { echo "it_dashboard_browser: skipped: Chromium cannot start: /usr/bin/chromium is not installed (scripts/install-deps.sh installs it)"; exit 77; }
[ -e "$DATA/train-images-idx3-ubyte" ] || { echo "it_dashboard_browser: skipped: no MNIST in $DATA"; exit 77; }
command -v node >/dev/null || { echo "FAIL: node is not installed (scripts/install-deps.sh installs nodejs)"; exit 1; }
if [ ! -f tests/browser/node_modules/playwright-core/package.json ]; then
  echo "tests/browser: npm ci (playwright-core, pinned by tests/browser/package-lock.json; no browser download)"
  (cd tests/browser && npm ci --no-audit --no-fund --loglevel=error) || { echo "FAIL: npm ci in tests/browser"; exit 1; }
fi

port=$(free_port); mport=$((port + 1))
every=50   # server.checkpoint_every_steps (the Status read below waits on it)
"$BUILD/bin/psd" --listen "127.0.0.1:$port" --metrics-listen "127.0.0.1:$mport" --checkpoint-dir "$tmp/ck" \
  --set server.checkpoint_every_steps=$every 2>"$tmp/psd.log" &
pids+=($!)
for _ in $(seq 150); do (exec 3<>/dev/tcp/127.0.0.1/$mport) 2>/dev/null && break; sleep 0.1; done
shot=${SCREENSHOT:-$tmp/dashboard.png}
node tests/browser/dashboard_check.mjs "http://127.0.0.1:$mport/" "$tmp/ready" "$tmp/done" "$tmp/status.json" \
  "$shot" >"$tmp/browser.log" 2>&1 &
browser=$!
pids+=("$browser")
# the page shows psd before training starts
for _ in $(seq 600); do [ -e "$tmp/ready" ] || ! kill -0 "$browser" 2>/dev/null && break; sleep 0.1; done
for r in 1 2; do
  "$BUILD/bin/ps-train" --server "127.0.0.1:$port" --rank "$r" --world-size 3 --data "$DATA" \
    --max-batches "$BATCHES" --log-every 40 --no-eval >"$tmp/rank$r.log" 2>&1 &
  pids+=($!); tp[$r]=$!
done
wait "${tp[1]}" || fail "trainer 1"
wait "${tp[2]}" || fail "trainer 2"
# Status once psd's checkpoints have settled: psd's main loop looks once a
# second whether one is due (>= checkpoint_every_steps since the last), so
# one may still be written after the last Step (fresh-clone make tests read
# step 98 and 99 from Status, twice 0.4 s apart, while the page a moment later
# showed the next one, 160). Settled: none due at the final version.
for _ in $(seq 75); do
  "$BUILD/bin/ps-train" status --server "127.0.0.1:$port" >"$tmp/status.txt" 2>&1 || fail "ps-train status"
  ck=$(sed -n 's/.*last checkpoint *step \([0-9]*\).*/\1/p' "$tmp/status.txt")
  ver=$(sed -n 's/.*model .*, version \([0-9]*\).*/\1/p' "$tmp/status.txt")
  [ -n "$ck" ] && [ -n "$ver" ] && [ $((ver - ck)) -lt "$every" ] && break
  sleep 0.4
done
$PY - "$tmp" "$BATCHES" <<'PYEOF' || fail "reading Status and the trainers' summaries"
import json, re, sys
tmp, batches = sys.argv[1], int(sys.argv[2])
s = open(f"{tmp}/status.txt").read()
m = re.search(r"model\s+(\S+), version (\d+)", s)
out = {"model": m.group(1), "version": int(m.group(2)),
       "samples": int(re.search(r"samples\s+(\d+) trained", s).group(1)),
       "live": int(re.search(r"contexts\s+(\d+) live", s).group(1)),
       "trainers_seen": int(re.search(r"trainers seen\s+(\d+)", s).group(1)),
       "checkpoint_step": None, "trainers": []}
c = re.search(r"last checkpoint\s+step (\d+)", s)
if c:
    out["checkpoint_step"] = int(c.group(1))
for r in (1, 2):
    t = open(f"{tmp}/rank{r}.log").read()
    n = int(re.search(rf"Rank {r}: (\d+) samples in", t).group(1))
    out["trainers"].append({"rank": r, "samples": n, "batches": batches})
json.dump(out, open(f"{tmp}/status.json", "w"))
print("Status:", out)
PYEOF
touch "$tmp/done"
rc=0
wait "$browser" || rc=$?
cat "$tmp/browser.log"
[ $rc -eq 77 ] && { grep -m1 skipped "$tmp/browser.log" | sed 's/^/it_dashboard_browser: /'; exit 77; }
[ $rc -eq 0 ] || fail "the dashboard in Chromium (above)"
echo "it_dashboard_browser: OK ($(grep -c '^ok' "$tmp/browser.log") checks in Chromium; screenshot $shot)"
