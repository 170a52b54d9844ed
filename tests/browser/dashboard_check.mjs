// dashboard_check.mjs - drives Debian's Chromium (playwright-core, no browser
// download) against psd's dashboard for tests/it_dashboard_browser.sh.
//
//   node dashboard_check.mjs URL READY_FILE DONE_FILE STATUS_JSON SCREENSHOT
//
// 1. Opens URL headless (fresh profile; every host but 127.0.0.1 unresolvable,
//    so the page can only work offline), writes READY_FILE once it has drawn
//    psd's first answer (the shell starts the trainers then), and waits until
//    the charts have been redrawn with new points and the model version
//    shown has moved: the page updates live.
// 2. Waits for DONE_FILE (the trainers finished and the shell wrote
//    STATUS_JSON from `ps-train status` and the trainers' own summaries),
//    then until the page shows STATUS_JSON's model version, and compares
//    the page's values with it: model, version, samples, trainers seen,
//    psd's resident memory shown beside its uptime,
//    live contexts, last checkpoint, and per trainer rank its samples and
//    steps against what that trainer itself printed; no GPU memory line from
//    this CPU psd, then (its answers rewritten with two GPUs' figures) one
//    per device in the page's units.
// 3. Checks every request went to psd, none failed, and no script error
//    happened; saves a screenshot. Prints one line per check; exits 1 on any
//    failure.
import { chromium } from "playwright-core";
import { existsSync, readFileSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [url, readyFile, doneFile, statusFile, shot] = process.argv.slice(2);
const origin = new URL(url).origin;
let failed = 0;
function check(ok, what) {
  console.log((ok ? "ok    " : "FAIL  ") + what);
  if (!ok) failed++;
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function until(what, fn, timeoutMs) {
  const t0 = Date.now();
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() - t0 > timeoutMs) throw new Error("timed out waiting for " + what);
    await sleep(200);
  }
}

const profile = mkdtempSync(join(tmpdir(), "psd-chromium-"));
let browser;
try {
  browser = await chromium.launchPersistentContext(profile, {
    executablePath: "/usr/bin/chromium",
    headless: true,
    viewport: { width: 1440, height: 1400 },
    args: ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync", "--disable-quic",
      "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"],
  });
} catch (e) {
  console.log("skipped: Chromium cannot start: " + String(e).split("\n")[0]);
  rmSync(profile, { recursive: true, force: true });
  process.exit(77);
}
const page = browser.pages()[0] || (await browser.newPage());
const foreign = [], failedReq = [], errors = [];
page.on("request", (r) => { if (!r.url().startsWith(origin + "/")) foreign.push(r.url()); });
page.on("requestfailed", (r) => failedReq.push(r.url() + " " + (r.failure() || {}).errorText));
page.on("response", (r) => { if (r.status() >= 400) failedReq.push(r.url() + " HTTP " + r.status()); });
page.on("pageerror", (e) => errors.push(String(e)));
page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });

const val = (id) => page.$eval("#" + id, (e) => e.dataset.value ?? "").catch(() => "");
const text = (sel) => page.$eval(sel, (e) => e.textContent).catch(() => "");
const num = async (id) => { const v = await val(id); return v === "" ? NaN : Number(v); };
const points = (key) => page.$eval(`[data-chart="${key}"]`, (e) => Number(e.dataset.points || 0)).catch(() => 0);

try {
  await page.goto(url, { waitUntil: "load" });
  // 1. live: the page draws, then redraws with more points while the version moves
  // (generous limits: they only matter when something is broken, and a loaded machine is slow)
  await until("the first answer drawn", async () => Number(await page.getAttribute("body", "data-updates")) >= 1, 60000);
  const p0 = await points("throughput"), v0 = await num("model-version");
  writeFileSync(readyFile, "ready\n");
  await until("the charts to update", async () => (await points("throughput")) >= Math.max(3, p0 + 2), 60000);
  await until("the model version to move", async () => (await num("model-version")) > v0, 180000);
  const p1 = await points("throughput");
  check(p1 >= p0 + 2, `charts updated live: throughput chart ${p0} -> ${p1} points`);
  check((await page.$$("[data-chart] canvas")).length >= 3, "charts drawn (uPlot canvases)");
  // the loss series appears with the first history point after the first Step
  await until("a loss chart", async () => (await page.$('[data-chart="loss"] canvas')) !== null, 60000);
  check(true, "a loss chart (the trainers' Step scalar 'loss')");

  // 2. the finished run against Status and the trainers' own counts
  await until("the trainers to finish", async () => existsSync(doneFile), 300000);
  const st = JSON.parse(readFileSync(statusFile, "utf8"));
  await until(`the page to show version ${st.version}`, async () => (await num("model-version")) === st.version, 30000);
  check((await text("#model-name")) === st.model, `model name ${st.model}`);
  const up = await text("#uptime");
  check(/^up .+ · [0-9.]+ (KiB|MiB|GiB) resident$/.test(up), `psd's uptime and resident memory shown ("${up}")`);
  check((await num("model-version")) === st.version, `model version ${await num("model-version")} == Status ${st.version}`);
  check((await num("samples")) === st.samples, `samples ${await num("samples")} == Status ${st.samples}`);
  const seen = (await text("#trainers-foot")).match(/^([\d,]+) rank/);
  check(seen && Number(seen[1].replace(/,/g, "")) === st.trainers_seen, `trainers seen "${await text("#trainers-foot")}" == Status ${st.trainers_seen}`);
  check((await num("contexts-live")) === st.live, `live contexts ${await num("contexts-live")} == Status ${st.live}`);
  if (st.checkpoint_step != null) {
    // psd writes the last checkpoint after the Step that reached its version: the page can
    // show that version one refresh before the checkpoint's step
    const want = "step " + st.checkpoint_step.toLocaleString("en-US");
    await until(`the page to show checkpoint step ${st.checkpoint_step}`, async () => (await text("#ckpt-kv")).includes(want), 30000).catch(() => {});
    const ck = await text("#ckpt-kv");
    check(ck.includes("step " + st.checkpoint_step.toLocaleString("en-US")), `last checkpoint step ${st.checkpoint_step} shown ("${ck.slice(0, 80)}...")`);
  }
  const rows = await page.$$eval("#trainers tbody tr", (trs) => trs.map((tr) => [...tr.cells].map((c) => c.textContent.trim())));
  for (const t of st.trainers) {
    const r = rows.find((x) => x[0] === String(t.rank));
    const n = (s) => Number(String(s).replace(/,/g, ""));
    check(r && n(r[2]) === t.samples, `rank ${t.rank}: samples ${r ? r[2] : "(no row)"} == the trainer's own ${t.samples}`);
    check(r && n(r[5]) === t.batches, `rank ${t.rank}: steps ${r ? r[5] : "(no row)"} == its batches ${t.batches}`);
    check(r && n(r[4]) === 0 && n(r[6]) === 0, `rank ${t.rank}: no retries (replayed ${r ? r[4] : "?"}, repeated ${r ? r[6] : "?"})`);
  }
  const lossShown = await num("loss");
  check(isFinite(lossShown) && lossShown > 0 && lossShown < 5, `loss shown: ${lossShown}`);

  // GPU memory in the Compute card: none from this CPU psd; a GPU's figures
  // (psd's answer with devices.memory filled in, as a GPU psd sends it) drawn
  // per device in the page's own units
  const api = await page.evaluate(() => fetch("/api/dashboard", { cache: "no-store" }).then((r) => r.json()));
  check(Array.isArray(api.devices.memory) && api.devices.memory.length === 0, "CPU psd: devices.memory is [] in /api/dashboard");
  check(!(await text("#devices-kv")).includes(" memory"), "CPU psd: no device memory line in the Compute card");
  const MiB = 1048576;
  const gpus = [{ device: "cuda:0", live: 15 * MiB, cached: 248 * MiB, free: 142043 * MiB, total: 143155 * MiB },
    { device: "cuda:1", live: 1536 * MiB + 512 * 1024, cached: 0, free: 100 * 1024 * MiB, total: 143155 * MiB }];
  await page.route((u) => new URL(u).pathname === "/api/dashboard", async (route) => {
    const r = await route.fetch();
    const j = await r.json();
    j.devices.memory = gpus;
    await route.fulfill({ response: r, json: j });
  });
  const card = await until("the GPU memory lines", async () => {
    const t = await page.$$eval("#devices-kv dt, #devices-kv dd", (es) => es.map((e) => e.textContent));
    return t.includes("cuda:1 memory") ? t : null;
  }, 30000).catch(() => []);
  const line = (dev) => card[card.indexOf(dev + " memory") + 1];
  check(card.includes("cuda:0 memory") && line("cuda:0") === "15.0 MiB live + 248 MiB cached · 139 GiB free of 140 GiB",
    `cuda:0 memory shown ("${card.includes("cuda:0 memory") ? line("cuda:0") : "no line"}")`);
  check(card.includes("cuda:1 memory") && line("cuda:1") === "1.5 GiB live + 0 B cached · 100 GiB free of 140 GiB",
    `cuda:1 memory shown ("${card.includes("cuda:1 memory") ? line("cuda:1") : "no line"}")`);
  await page.unrouteAll({ behavior: "ignoreErrors" });

  // 3. offline and clean
  check(foreign.length === 0, "every request went to psd" + (foreign.length ? ": " + foreign.join(", ") : ""));
  check(failedReq.length === 0, "no request failed" + (failedReq.length ? ": " + failedReq.join(", ") : ""));
  check(errors.length === 0, "no script error" + (errors.length ? ": " + errors.join(" | ") : ""));
  await page.evaluate(() => window.scrollTo(0, 0));
  await sleep(300);
  await page.screenshot({ path: shot, fullPage: true });
  check(existsSync(shot), "screenshot " + shot);
} catch (e) {
  check(false, String(e));
  await page.screenshot({ path: shot, fullPage: true }).catch(() => {});
}
await browser.close();
rmSync(profile, { recursive: true, force: true });
process.exit(failed ? 1 : 0);
