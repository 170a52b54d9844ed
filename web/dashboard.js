/* psd dashboard: polls /api/dashboard (server/dashboard.c) every 2 s, keeps
 * the history it is sent (only new points after the first answer), and
 * draws it with uPlot. Read-only; every value is written with textContent.
 * Test hooks: body[data-updates] counts answers drawn; each KPI value has
 * data-value (the raw number); each chart has data-points. */
"use strict";
(function () {
  const POLL_MS = 2000;
  const ACTIVE_S = 30;               /* a trainer seen within this is "active" */
  const COLORS = ["#4fb3ff", "#f5b942", "#3ecf8e", "#c792ea", "#ff6b6b", "#7fdbca", "#ffa07a", "#a3be8c"];
  const $ = (id) => document.getElementById(id);

  let hist = { gen: null, next: 0, t: [], span: [], series: {} };
  const charts = {};                 /* key -> { key, sig, box, plot, now, u } */
  let updates = 0, lastOk = 0, lastData = null, timer = null;

  /* ---- formatting ---- */
  const nf = new Intl.NumberFormat("en-US");
  function fmtInt(v) { return v == null || !isFinite(v) ? "–" : nf.format(Math.round(v)); }
  function fmtNum(v, d) {
    if (v == null || !isFinite(v)) return "–";
    const a = Math.abs(v);
    if (v === 0 && d == null) return "0";
    if (d == null) d = a >= 1000 ? 0 : a >= 100 ? 1 : a >= 10 ? 2 : a >= 1 ? 3 : 4;
    return v.toLocaleString("en-US", { minimumFractionDigits: d, maximumFractionDigits: d });
  }
  function fmtShort(v) {
    if (v == null || !isFinite(v)) return "";
    const a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(a >= 1e10 ? 0 : 1) + "G";
    if (a >= 1e6) return (v / 1e6).toFixed(a >= 1e7 ? 0 : 1) + "M";
    if (a >= 1e4) return (v / 1e3).toFixed(0) + "k";
    if (a >= 100) return v.toFixed(0);
    if (a >= 1) return v.toFixed(a >= 10 ? 1 : 2);
    return v.toPrecision(2);
  }
  function fmtBytes(b) {
    if (b == null || !isFinite(b)) return "–";
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(b) >= 1024 && i < u.length - 1) { b /= 1024; i++; }
    return (i ? b.toFixed(b >= 100 ? 0 : 1) : b.toFixed(0)) + " " + u[i];
  }
  function fmtDur(s) {
    if (s == null || !isFinite(s) || s < 0) return "–";
    s = Math.floor(s);
    const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60), x = s % 60;
    if (d) return d + "d " + h + "h " + m + "m";
    if (h) return h + "h " + String(m).padStart(2, "0") + "m";
    if (m) return m + "m " + String(x).padStart(2, "0") + "s";
    return x + "s";
  }
  function fmtAgo(s) { return s == null || !isFinite(s) ? "–" : s < 2 ? "just now" : fmtDur(s) + " ago"; }

  function setText(id, text, raw) {
    const el = $(id);
    if (!el) return;
    el.textContent = text;
    if (raw !== undefined) el.dataset.value = raw == null || !isFinite(raw) ? "" : String(raw);
  }
  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text != null) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }
  function kv(id, pairs) {
    const dl = $(id);
    dl.replaceChildren();
    for (const [k, v] of pairs) {
      if (v == null) continue;
      dl.append(el("dt", k), el("dd", v));
    }
  }
  function rows(tableId, list) {
    const tb = $(tableId).tBodies[0];
    tb.replaceChildren();
    for (const cells of list) {
      const tr = document.createElement("tr");
      for (const c of cells) {
        const td = el("td", c.text != null ? c.text : c, c.cls);
        if (c.dot) td.prepend(el("span", null, "dot"));
        tr.append(td);
      }
      if (cells.stale) tr.className = "stale";
      tb.append(tr);
    }
  }

  /* ---- history ---- */
  function mergeHistory(h) {
    if (h.full || hist.gen !== h.gen) {
      hist = { gen: h.gen, next: h.next, t: h.t.slice(), span: h.span.slice(), series: {} };
      for (const s of h.series) hist.series[s.name] = { kind: s.kind, v: s.v.slice() };
      return;
    }
    const n0 = hist.t.length, add = h.t.length;
    hist.t.push(...h.t);
    hist.span.push(...h.span);
    const seen = new Set();
    for (const s of h.series) {
      seen.add(s.name);
      let dst = hist.series[s.name];
      if (!dst) dst = hist.series[s.name] = { kind: s.kind, v: new Array(n0).fill(null) };
      dst.v.push(...s.v);
    }
    for (const name in hist.series) if (!seen.has(name)) for (let i = 0; i < add; i++) hist.series[name].v.push(null);
    hist.gen = h.gen;
    hist.next = h.next;
  }
  function ser(name) { const s = hist.series[name]; return s ? s.v : null; }
  function hasData(v) { return v && v.some((x) => x != null); }
  function lastOf(v) {
    if (!v) return null;
    for (let i = v.length - 1; i >= 0; i--) if (v[i] != null) return v[i];
    return null;
  }

  /* ---- charts ---- */
  function chartDefs(m) {
    const unit = m.model.unit, defs = [];
    defs.push({ key: "throughput", title: "Throughput", series: [
      { label: unit + "/s", v: ser("samples"), axis: 0 },
      { label: "steps/s", v: ser("steps"), axis: 1 }] });
    const fused = ser("loss.fused"), scalarLoss = ser("scalar.loss");
    const loss = hasData(fused) ? fused : scalarLoss;
    const lossName = hasData(fused) ? "loss (psd's cross-entropy)" : "loss (trainers' Step scalar)";
    if (loss) {
      defs.push({ key: "loss", title: "Loss", series: [{ label: lossName, v: loss, axis: 0, gaps: true }] });
      if (m.model.perplexity)
        defs.push({ key: "perplexity", title: "Perplexity = exp(loss), log scale", log: true, series: [
          { label: "perplexity", v: loss.map((x) => (x == null ? null : Math.exp(x))), axis: 0, gaps: true }] });
    }
    for (const name of Object.keys(hist.series).sort()) {
      if (!name.startsWith("scalar.")) continue;
      const s = name.slice(7);
      if (s === "loss" && loss === scalarLoss) continue;   /* already the loss chart */
      const list = [{ label: s + " (mean of the interval)", v: ser(name), axis: 0, gaps: true }];
      if (ser("ema." + s)) list.push({ label: s + " running average", v: ser("ema." + s), axis: 0, gaps: true });
      defs.push({ key: "scalar." + s, title: "Round metric: " + s, series: list });
    }
    defs.push({ key: "memory", title: "Context memory", series: [
      { label: "bytes held", v: ser("contexts.bytes"), axis: 0, bytes: true, gaps: true },
      { label: "live contexts", v: ser("contexts.live"), axis: 1, gaps: true }] });
    defs.push({ key: "network", title: "Messages (payload bytes/s)", series: [
      { label: "received", v: ser("bytes.received"), axis: 0, bytes: true },
      { label: "sent", v: ser("bytes.sent"), axis: 0, bytes: true }] });
    return defs.map((d) => ({ ...d, series: d.series.filter((s) => s.v) })).filter((d) => d.series.length);
  }

  /* Time ticks in the viewer's local time, one line: seconds while the
   * ticks are less than a minute apart, the date once they are a day apart. */
  function timeTicks(u, splits, axisIdx, space, incr) {
    const two = (n) => String(n).padStart(2, "0");
    return splits.map((ts) => {
      const d = new Date(ts * 1000), hm = two(d.getHours()) + ":" + two(d.getMinutes());
      if (incr < 60) return hm + ":" + two(d.getSeconds());
      if (incr < 86400) return hm;
      return (d.getMonth() + 1) + "/" + d.getDate() + " " + hm;
    });
  }

  function makeChart(c, def) {
    const css = getComputedStyle(document.documentElement);
    const muted = css.getPropertyValue("--muted").trim(), line = css.getPropertyValue("--line").trim();
    const two = def.series.some((s) => s.axis === 1);
    const bytes = def.series.some((s) => s.bytes);
    const axisFmt = (b) => (u, vals) => vals.map((v) => (b ? fmtBytes(v) : fmtShort(v)));
    const axes = [{ stroke: muted, grid: { stroke: line, width: 1 }, ticks: { stroke: line }, values: timeTicks, space: 90 },
      { stroke: muted, grid: { stroke: line, width: 1 }, ticks: { stroke: line }, size: bytes ? 78 : 64, values: axisFmt(bytes), scale: "y" }];
    if (def.log) axes[1].filter = (u, splits) => splits.map((v) => (Math.abs(Math.log10(v) % 1) < 1e-6 ? v : null));
    if (two) axes.push({ side: 1, stroke: muted, grid: { show: false }, size: 54, values: axisFmt(false), scale: "y2" });
    const series = [{}].concat(def.series.map((s, i) => ({
      label: s.label, scale: s.axis === 1 ? "y2" : "y", stroke: COLORS[i % COLORS.length], width: 2,
      spanGaps: !!s.gaps, points: { show: false },
      fill: i === 0 ? COLORS[0] + "22" : undefined,
      value: (u, v) => (v == null ? "–" : s.bytes ? fmtBytes(v) : fmtNum(v)),
    })));
    const opts = {
      width: Math.max(200, c.plot.clientWidth), height: 200, series, axes,
      scales: { x: { time: true }, y: def.log ? { distr: 3, log: 10 } : { range: (u, lo, hi) => [Math.min(0, lo), hi > lo ? hi * 1.05 : lo + 1] },
        y2: { range: (u, lo, hi) => [Math.min(0, lo), hi > lo ? hi * 1.05 : lo + 1] } },
      legend: { live: true }, cursor: { points: { size: 6 } },
    };
    c.u = new uPlot(opts, [[]].concat(def.series.map(() => [])), c.plot);
  }

  function drawCharts(m) {
    const box = $("charts");
    const defs = chartDefs(m);
    const keep = new Set(defs.map((d) => d.key));
    for (const k in charts) if (!keep.has(k)) { charts[k].u && charts[k].u.destroy(); charts[k].box.remove(); delete charts[k]; }
    for (const def of defs) {
      const sig = def.series.map((s) => s.label).join("|") + (def.log ? "|log" : "");
      let c = charts[def.key];
      if (!c) {
        c = charts[def.key] = { key: def.key, sig: "", box: el("div", null, "chart") };
        c.box.dataset.chart = def.key;
        const h = el("h3");
        h.append(el("span", def.title));
        c.now = el("span", "", "now");
        h.append(c.now);
        c.plot = el("div", null, "plot");
        c.box.append(h, c.plot);
        box.append(c.box);
      }
      if (c.sig !== sig) { if (c.u) c.u.destroy(); c.u = null; c.sig = sig; }
      const n = hist.t.length;
      c.box.dataset.points = String(n);
      if (n < 2) {
        if (!c.plot.querySelector(".nodata")) c.plot.replaceChildren(el("div", "collecting data…", "nodata"));
        continue;
      }
      if (!c.u) { c.plot.replaceChildren(); makeChart(c, def); }
      c.u.setData([hist.t].concat(def.series.map((s) => s.v)));
      const first = def.series[0], now = lastOf(first.v);
      c.now.textContent = now == null ? "" : (first.bytes ? fmtBytes(now) : fmtNum(now)) + " " + (first.label.split(" (")[0]);
    }
  }

  /* ---- cards ---- */
  function drawKpis(m) {
    const unit = m.model.unit;
    setText("model-version", fmtInt(m.model.version), m.model.version);
    setText("samples-label", unit + " trained");
    setText("samples", fmtInt(m.model.samples), m.model.samples);
    setText("th-samples", unit);
    const rate = lastOf(ser("samples")), steps = lastOf(ser("steps"));
    setText("throughput", rate == null ? "–" : fmtNum(rate, 0) + " /s", rate);
    setText("throughput-foot", rate === 0 ? "idle: no " + unit + " in the last interval"
      : unit + "/s" + (steps == null ? "" : " · " + fmtNum(steps, 1) + " steps/s"));
    const fused = ser("loss.fused");
    const lossV = hasData(fused) ? lastOf(fused) : lastOf(ser("scalar.loss"));
    setText("loss", fmtNum(lossV), lossV);
    setText("loss-label", m.model.perplexity ? "Loss · perplexity" : "Loss");
    setText("loss-foot", lossV == null ? "no loss reported yet"
      : (m.model.perplexity ? "ppl " + fmtNum(Math.exp(lossV), 1) + " · " : "") + (hasData(fused) ? "psd's cross-entropy" : "trainers' Step scalar"));
    const active = m.trainers.filter((t) => t.rank >= 0 && t.last_seen_s < ACTIVE_S).length;
    setText("trainers-active", fmtInt(active) + " active", active);
    setText("trainers-foot", fmtInt(m.contexts.trainers_seen) + " rank" + (m.contexts.trainers_seen === 1 ? "" : "s") + " seen by psd");
    setText("contexts-live", fmtInt(m.contexts.live) + " live", m.contexts.live);
    const frac = m.contexts.budget > 0 ? Math.min(1, m.contexts.bytes / m.contexts.budget) : 0;
    $("ctx-fill").style.width = (frac * 100).toFixed(1) + "%";
    setText("ctx-foot", fmtBytes(m.contexts.bytes) + (m.contexts.budget > 0 ? " of " + fmtBytes(m.contexts.budget) + " budget" : " (no budget)"));
  }

  function drawHeader(m) {
    const p = m.psd;
    setText("model-name", m.model.name);
    setText("psd-version", "psd " + p.version);
    setText("footer-version", "psd " + p.version);
    const sn = $("server-name");
    if (m.cluster.self) { sn.hidden = false; sn.textContent = m.cluster.self + " of " + m.cluster.name; } else sn.hidden = true;
    const st = $("state");
    st.textContent = p.draining ? "draining" : p.serving ? "serving" : "not serving";
    st.className = "pill " + (p.draining ? "warn" : p.serving ? "ok" : "bad");
    st.title = p.state;
    setText("uptime", "up " + fmtDur(p.uptime_s) + (p.rss_bytes != null ? " · " + fmtBytes(p.rss_bytes) + " resident" : ""));
    $("uptime").title = p.cpu_s != null ? "psd's CPU time: " + fmtDur(p.cpu_s) : "";
    document.title = m.model.name + " · v" + m.model.version + " · psd";
  }

  function drawTrainers(m) {
    const list = m.trainers.map((t) => {
      const r = [
        { text: t.rank < 0 ? "other" : String(t.rank), dot: true },
        fmtAgo(t.last_seen_s),
        { text: fmtInt(t.samples), cls: "num" },
        { text: fmtInt(t.forwards), cls: "num" },
        { text: fmtInt(t.replayed_forwards), cls: "num" },
        { text: fmtInt(t.steps), cls: "num" },
        { text: fmtInt(t.repeated_steps), cls: "num" },
        { text: fmtInt(t.partial_applied) + " / " + fmtInt(t.partial_lost), cls: "num" },
        { text: fmtNum(t.loss), cls: "num" },
      ];
      r.stale = t.last_seen_s >= ACTIVE_S;
      return r;
    });
    rows("trainers", list);
    $("trainers-empty").hidden = list.length > 0;
  }

  function drawCluster(m) {
    const c = m.cluster, single = c.servers.length === 0;
    kv("cluster-kv", [
      ["cluster", c.name + (single ? " (one psd)" : " · " + c.servers.length + " servers")],
      ["this psd", (c.self ? c.self + " · " : "") + m.psd.listen + " · " + (m.psd.tls ? "TLS" : "plaintext")],
      ["hosts", m.model.hosted],
      ["partial steps", fmtInt(m.partial_steps.applied) + " applied here, " + fmtInt(m.partial_steps.lost) + " lost here"],
    ]);
    const pl = [];
    for (const s of c.placement) {
      if (s.shards) {
        for (const sh of s.shards)
          pl.push([s.stage, sh.server || "this psd", sh.device, s.table + " [" + fmtInt(sh.lo) + ", " + fmtInt(sh.hi) + ") of " + fmtInt(s.rows)]);
      } else {
        pl.push([s.stage, s.server || "this psd", s.device, "all"]);
      }
    }
    rows("placement", pl);
    const ul = $("servers");
    ul.replaceChildren();
    for (const s of c.servers) {
      const li = el("li");
      li.append(el("strong", s.name), document.createTextNode(" " + s.address + " "));
      if (s.self) li.append(el("span", "this dashboard", "self"));
      else if (s.dashboard) { const a = el("a", "dashboard"); a.href = s.dashboard; li.append(a); }
      ul.append(li);
    }
  }

  function drawModel(m) {
    const md = m.model;
    kv("model-kv", [
      ["model", md.name],
      ["weights", fmtInt(md.weights) + " here"],
      ["optimizer", md.optimizer + ", lr " + fmtNum(md.lr)],
      ["consistency", md.consistency],
      ["non-finite", md.nonfinite_policy + ": " + fmtInt(md.nonfinite_rejected) + " rejected, " + fmtInt(md.nonfinite_skipped) + " skipped"],
    ]);
    rows("stages", md.stages.map((s) => [
      s.name + (s.params_only ? " (weights only)" : "") + (s.row_hi != null ? " rows [" + fmtInt(s.row_lo) + ", " + fmtInt(s.row_hi) + ")" : ""),
      s.device, { text: fmtInt(s.weights), cls: "num" }]));
  }

  function drawSide(m) {
    const ck = m.checkpoint;
    kv("ckpt-kv", ck.dir ? [
      ["directory", ck.dir],
      ["last", ck.last_step != null ? "step " + fmtInt(ck.last_step) + ", " + fmtAgo(ck.age_s) : "none yet"],
      ["file", ck.path || null],
      ["policy", "every " + (ck.every_steps ? fmtInt(ck.every_steps) + " steps" : "") + (ck.every_steps && ck.every_s ? " or " : "") +
        (ck.every_s ? fmtDur(ck.every_s) : "") + ", keep " + ck.keep],
    ] : [["checkpoints", "off (server.checkpoint_dir is empty)"]]);
    const dv = m.devices;
    kv("devices-kv", [
      ["CPU ISA", dv.cpu_isa],
      ["CPU backend", dv.cpu_backend + ", " + dv.compute_threads + " compute threads"],
      ["build", dv.build],
      ["devices", Array.from(new Set(m.model.stages.map((s) => s.device))).join(", ")],
      /* a GPU's memory: what psd's stages hold (live, and freed blocks cached for
       * reuse), then the device's own free and total (every process's) */
      ...(dv.memory || []).map((g) => [g.device + " memory", fmtBytes(g.live) + " live + " + fmtBytes(g.cached) +
        " cached · " + fmtBytes(g.free) + " free of " + fmtBytes(g.total)]),
    ]);
    const r = m.rounds;
    rows("rounds", r.scalars.map((s) => [s.name, { text: fmtInt(s.count), cls: "num" }, { text: fmtNum(s.min), cls: "num" },
      { text: fmtNum(s.mean), cls: "num" }, { text: fmtNum(s.max), cls: "num" }, { text: fmtNum(s.ema), cls: "num" }]));
    $("rounds-empty").hidden = r.scalars.length > 0;
    kv("rounds-kv", [
      ["rounds closed", fmtInt(r.round)],
      ["stop", r.stop_metric ? r.stop_metric + " running average > " + fmtNum(r.stop_threshold) + (r.solved ? " · solved" : " · not yet") : "none"],
    ]);
    const a = m.admission, cx = m.contexts;
    kv("admission-kv", [
      ["context memory", fmtBytes(cx.bytes) + (cx.budget > 0 ? " of " + fmtBytes(cx.budget) : " (no budget)") + " · " + fmtInt(cx.clients) + " clients"],
      ["contexts", fmtInt(cx.opened) + " opened, " + fmtInt(cx.expired) + " expired (idle > " + fmtDur(cx.ttl_s) + "), " +
        fmtInt(cx.evicted) + " evicted, " + fmtInt(cx.refused) + " refused"],
      ["calls", fmtInt(a.calls) + " in progress of " + fmtInt(a.max_calls) + " · " + fmtInt(a.refused) + " refused · " + fmtInt(a.stalled) + " stalled"],
      ["connections closed", fmtInt(a.connections_closed) + " (HTTP/2 rapid reset)"],
      ["messages", fmtBytes(a.bytes_received) + " received, " + fmtBytes(a.bytes_sent) + " sent"],
    ]);
  }

  function draw(m) {
    drawHeader(m);
    drawKpis(m);
    drawCharts(m);
    drawTrainers(m);
    drawCluster(m);
    drawModel(m);
    drawSide(m);
  }

  async function poll() {
    clearTimeout(timer);
    try {
      const since = hist.gen == null ? "" : "?since=" + hist.gen + "." + hist.next;
      const r = await fetch("/api/dashboard" + since, { cache: "no-store" });
      if (!r.ok) throw new Error("HTTP " + r.status);
      const m = await r.json();
      mergeHistory(m.history);
      lastData = m;
      draw(m);
      lastOk = Date.now();
      updates++;
      document.body.dataset.updates = String(updates);
      document.body.dataset.state = "ok";
    } catch (e) {
      document.body.dataset.state = "error";
      const st = $("state");
      st.textContent = "unreachable";
      st.className = "pill bad";
      st.title = String(e);
    }
    setText("updated", lastOk ? "updated " + new Date(lastOk).toLocaleTimeString() : "");
    timer = setTimeout(poll, POLL_MS);
  }

  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      for (const k in charts) if (charts[k].u) charts[k].u.setSize({ width: Math.max(200, charts[k].plot.clientWidth), height: 200 });
    }, 100);
  });
  document.addEventListener("visibilitychange", () => { if (!document.hidden && lastData) poll(); });
  poll();
})();
