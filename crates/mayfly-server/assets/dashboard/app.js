// Mayfly's dashboard: spin-up P50/P95 per five-minute window, iterations by
// task, warm pools, live sandboxes with what they use, and the live event
// stream. Everything comes from the daemon's REST API with the caller's
// token; the page itself holds no data. Values from the API (labels, ids,
// event details) are hostile input: they only ever reach the page as text
// nodes, never as markup.
"use strict";

const REFRESH_MS = 3000;
// Usage is one request per sandbox: read it for the first ones only.
const USAGE_MAX = 25;
const EVENTS_KEPT = 50;
const TOKEN_KEY = "mayfly.token";
// A report over a longer window costs the daemon more (it reads every create
// and exec in it) and changes more slowly: it is read less often.
const STATS_EVERY_MS = { "1h": 3000, "6h": 10000, "24h": 30000, "7d": 60000 };

const $ = (id) => document.getElementById(id);

/** A failed API call: the HTTP status and the daemon's `{code, message}`. */
class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

const session = {
  token: null,
  load() {
    // A token passed once as `#token=…` is moved into session storage and
    // out of the address bar (and so out of history and bookmarks).
    const m = /^#token=(.+)$/.exec(window.location.hash);
    if (m) {
      this.save(decodeURIComponent(m[1]));
      window.history.replaceState(null, "", window.location.pathname + window.location.search);
    } else {
      this.token = window.sessionStorage.getItem(TOKEN_KEY);
    }
  },
  save(token) {
    this.token = token || null;
    if (this.token) window.sessionStorage.setItem(TOKEN_KEY, this.token);
    else window.sessionStorage.removeItem(TOKEN_KEY);
  },
  headers(extra) {
    const h = Object.assign({}, extra);
    if (this.token) h.Authorization = "Bearer " + this.token;
    return h;
  },
};

async function api(path, accept) {
  const res = await window.fetch(path, {
    headers: session.headers({ Accept: accept || "application/json" }),
    cache: "no-store",
  });
  if (res.ok) return res;
  let code = "http_" + res.status;
  let message = res.statusText || "request failed";
  try {
    const body = await res.json();
    if (body && body.code) code = body.code;
    if (body && body.message) message = body.message;
  } catch (_) {
    // Not the daemon's JSON error: keep the status line.
  }
  throw new ApiError(res.status, code, message);
}

const getJson = async (path) => (await api(path)).json();

// ---- formatting -----------------------------------------------------------

function fmtMs(v) {
  if (v === null || v === undefined) return "–";
  if (v < 1) return (v * 1000).toFixed(0) + " µs";
  if (v < 100) return v.toFixed(2) + " ms";
  return v.toFixed(0) + " ms";
}

function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return (i === 0 ? n.toFixed(0) : n.toFixed(1)) + " " + units[i];
}

function fmtDuration(ms) {
  if (ms < 0) return "–";
  const s = Math.floor(ms / 1000);
  if (s < 120) return s + " s";
  if (s < 7200) return Math.floor(s / 60) + " min";
  if (s < 172800) return Math.floor(s / 3600) + " h";
  return Math.floor(s / 86400) + " d";
}

// UTC to the second: 2026-11-26 07:14:48Z.
const fmtTime = (ms) => new Date(ms).toISOString().slice(0, 19).replace("T", " ") + "Z";
const clip = (s, n) => (s.length > n ? s.slice(0, n - 1) + "…" : s);

// ---- DOM helpers (text only) ---------------------------------------------

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "–" : String(text);
  if (cls) td.className = cls;
  return td;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const c of cells) tr.appendChild(c);
  return tr;
}

function fill(tableId, rows, empty) {
  const body = $(tableId).tBodies[0];
  body.replaceChildren(...rows);
  if (rows.length === 0 && empty) {
    const td = cell(empty, "muted");
    td.colSpan = $(tableId).tHead.rows[0].cells.length;
    body.appendChild(row([td]));
  }
}

function meter(part, whole) {
  const td = document.createElement("td");
  const m = document.createElement("span");
  m.className = "meter";
  const bar = document.createElement("span");
  const pct = whole > 0 ? Math.min(100, Math.round((100 * part) / whole)) : 0;
  bar.style.width = pct + "%";
  m.appendChild(bar);
  m.title = part + " of " + whole;
  td.appendChild(m);
  return td;
}

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs, text) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

// ---- sections ---------------------------------------------------------------

function showSpin(id, p) {
  $(id).textContent = p.count ? fmtMs(p.p50_ms) + " p50" : "–";
  $(id + "-sub").textContent = p.count
    ? "p95 " + fmtMs(p.p95_ms) + " · p99 " + fmtMs(p.p99_ms) + " · " + p.count + " creates"
    : "no creates in the window";
}

/** P50 and P95 of cold and pool spin-up, one point per five-minute window. */
function drawSpinChart(report) {
  const box = $("spin-chart");
  const windows = report.spin_up_windows || [];
  const series = [
    ["cold-p50", "cold p50", (w) => w.cold.p50_ms],
    ["cold-p95", "cold p95", (w) => w.cold.p95_ms],
    ["pool-p50", "pool p50", (w) => w.pool.p50_ms],
    ["pool-p95", "pool p95", (w) => w.pool.p95_ms],
  ];
  const values = [];
  for (const w of windows) for (const [, , f] of series) if (f(w) != null) values.push(f(w));
  if (values.length === 0) {
    box.replaceChildren(document.createTextNode("No creates in this window."));
    return;
  }
  const W = 900, H = 240, L = 56, R = 110, T = 10, B = 24;
  const step = report.window_secs * 1000;
  const x0 = report.since - (report.since % step);
  const x1 = Math.max(report.until, x0 + step);
  const lo = Math.log10(Math.max(0.005, Math.min(...values) / 1.5));
  const hi = Math.log10(Math.max(...values) * 1.5);
  const x = (t) => L + ((t + step / 2 - x0) / (x1 - x0)) * (W - L - R);
  const y = (v) => T + (1 - (Math.log10(Math.max(v, 0.005)) - lo) / (hi - lo || 1)) * (H - T - B);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "spin-up P50 and P95 per window" });
  for (let e = Math.ceil(lo); e <= Math.floor(hi); e += 1) {
    const v = Math.pow(10, e);
    root.appendChild(svg("line", { class: "grid", x1: L, x2: W - R, y1: y(v), y2: y(v) }));
    root.appendChild(svg("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end" }, fmtMs(v)));
  }
  root.appendChild(svg("text", { x: L, y: H - 6 }, fmtTime(x0)));
  root.appendChild(svg("text", { x: W - R, y: H - 6, "text-anchor": "end" }, fmtTime(x1)));
  series.forEach(([cls, name, f], i) => {
    // A window without creates of a kind breaks that kind's line.
    let d = "";
    let prev = null;
    for (const w of windows) {
      const v = f(w);
      if (v == null) {
        prev = null;
        continue;
      }
      const cmd = prev !== null && w.start - prev === step ? "L" : "M";
      d += `${cmd}${x(w.start).toFixed(1)},${y(v).toFixed(1)} `;
      if (cmd === "M") d += `l0.1,0 `;
      prev = w.start;
    }
    root.appendChild(svg("path", { class: cls, d: d.trim(), "data-series": name }));
    const ly = T + 14 + i * 18;
    root.appendChild(svg("line", { class: cls, x1: W - R + 8, x2: W - R + 30, y1: ly - 4, y2: ly - 4 }));
    root.appendChild(svg("text", { x: W - R + 34, y: ly }, name));
  });
  box.replaceChildren(root);
}

function taskBars(report, task) {
  const td = document.createElement("td");
  const step = report.window_secs * 1000;
  const first = report.since - (report.since % step);
  const n = Math.max(1, Math.ceil((report.until - first) / step));
  const peak = Math.max(1, task.peak_iterations_per_window);
  const root = svg("svg", { class: "bars", width: 240, height: 24, viewBox: `0 0 ${n} 24`, preserveAspectRatio: "none" });
  for (const w of task.windows) {
    const i = Math.floor((w.start - first) / step);
    const h = Math.max(1, (22 * w.iterations) / peak);
    const r = svg("rect", { x: i + 0.1, width: 0.8, y: 24 - h, height: h });
    r.appendChild(svg("title", {}, `${fmtTime(w.start)}: ${w.iterations} iterations, ${w.execs} execs`));
    root.appendChild(r);
  }
  td.appendChild(root);
  return td;
}

function showStats(r) {
  showSpin("pool-spin", r.spin_up.pool);
  showSpin("cold-spin", r.spin_up.cold);
  $("execs").textContent = String(r.execs.total);
  $("execs-sub").textContent = `ok ${r.execs.ok} · failed ${r.execs.failed} · timed out ${r.execs.timed_out}`;
  drawSpinChart(r);
  fill(
    "tasks",
    r.tasks.map((t) =>
      row([
        cell(t.task === null ? "(no task)" : clip(t.task, 64)),
        cell(t.iterations, "n"),
        cell(t.execs, "n"),
        cell(t.iterations_per_window.toFixed(2), "n"),
        cell(t.peak_iterations_per_window, "n"),
        taskBars(r, t),
      ]),
    ),
    "No sandboxes were created in this window.",
  );
}

function showPools(list) {
  $("pools-note").hidden = true;
  fill(
    "pools",
    list.pools.map((p) =>
      row([
        cell(p.name),
        cell(clip(p.template, 48)),
        cell(p.ready, "n"),
        cell(p.target, "n"),
        cell(p.max, "n"),
        cell(p.filling, "n"),
        cell(p.claims, "n"),
        cell(p.misses, "n"),
        meter(p.ready, p.target),
      ]),
    ),
    "No warm pools.",
  );
}

async function showSandboxes(list) {
  const live = list.sandboxes.filter((s) => s.state === "ready" || s.state === "creating");
  $("live").textContent = String(live.length);
  const usage = new Map();
  await Promise.all(
    live.slice(0, USAGE_MAX).map(async (s) => {
      try {
        usage.set(s.id, await getJson(`/v1/sandboxes/${encodeURIComponent(s.id)}/usage`));
      } catch (_) {
        // Gone since the list was read, or stopping: shown without usage.
      }
    }),
  );
  $("usage-note").textContent =
    live.length > USAGE_MAX ? `(usage of the first ${USAGE_MAX} of ${live.length})` : "";
  const now = Date.now();
  fill(
    "sandboxes",
    live.map((s) => {
      const u = usage.get(s.id);
      const task = s.labels && typeof s.labels.task === "string" ? clip(s.labels.task, 40) : "";
      return row([
        cell(s.id, "id"),
        cell(clip(s.template, 40)),
        cell(s.tenant),
        cell(task),
        cell(s.source),
        cell(fmtDuration(now - s.created_at), "n"),
        cell(fmtDuration(s.expires_at - now), "n"),
        cell(u ? u.cpu_seconds.toFixed(2) : null, "n"),
        cell(u ? fmtBytes(u.memory_bytes) : null, "n"),
        cell(u ? fmtBytes(u.memory_peak_bytes) : null, "n"),
        cell(u ? u.pids : null, "n"),
        cell(u && u.disk ? fmtBytes(u.disk.bytes) + (u.disk.truncated ? "+" : "") : null, "n"),
      ]);
    }),
    "No live sandboxes.",
  );
}

// ---- refresh loop -----------------------------------------------------------

function needToken(err) {
  $("main").hidden = true;
  $("login").hidden = false;
  $("login-why").textContent = err.message;
  $("login-why").className = "error";
  $("status").textContent = "not signed in";
}

let timer = null;
// The last stats report read: its query and when.
const statsCache = { path: null, at: 0 };

async function refresh() {
  clearTimeout(timer);
  const q = new URLSearchParams({ window: $("window").value });
  const task = $("task").value.trim();
  if (task) q.set("task", task);
  const statsPath = "/v1/stats?" + q.toString();
  const due =
    statsCache.path !== statsPath ||
    Date.now() - statsCache.at >= (STATS_EVERY_MS[$("window").value] || REFRESH_MS);
  const [stats, pools, sandboxes] = await Promise.allSettled([
    due ? getJson(statsPath) : Promise.resolve(null),
    getJson("/v1/pools"),
    getJson("/v1/sandboxes"),
  ]);
  if (due && stats.status === "fulfilled") Object.assign(statsCache, { path: statsPath, at: Date.now() });
  const failures = [stats, pools, sandboxes].filter((r) => r.status === "rejected").map((r) => r.reason);
  const unauth = failures.find((e) => e instanceof ApiError && e.status === 401);
  if (unauth) {
    needToken(unauth);
    return;
  }
  $("login").hidden = true;
  $("main").hidden = false;
  $("signout").hidden = !session.token;
  if (stats.status === "fulfilled" && stats.value) showStats(stats.value);
  if (pools.status === "fulfilled") showPools(pools.value);
  else if (pools.reason instanceof ApiError && pools.reason.status === 403) {
    fill("pools", []);
    $("pools-note").hidden = false;
    $("pools-note").textContent = "Pools are shown to admins only: " + pools.reason.message;
  }
  if (sandboxes.status === "fulfilled") await showSandboxes(sandboxes.value);
  const other = failures.filter((e) => !(e instanceof ApiError && e.status === 403));
  $("status").textContent = other.length
    ? "error: " + other[0].message
    : "updated " + new Date().toLocaleTimeString();
  $("status").className = other.length ? "error" : "muted";
  followEvents();
  timer = setTimeout(refresh, REFRESH_MS);
}

// ---- events (SSE over fetch, so the token can go in a header) --------------

// `stream` (admins: the live SSE stream) or `poll` (other tenants, whose
// stream is refused: their own events, paged on each refresh).
const events = { running: false, lastSeq: null, mode: "stream", empty: true };
const EVENT_PAGE = 1000;
// At most this many pages per refresh while catching up with a backlog.
const EVENT_PAGES = 20;

function addEvent(e) {
  const body = $("events").tBodies[0];
  if (events.empty) {
    body.replaceChildren();
    events.empty = false;
  }
  const tr = row([
    cell(e.seq, "n"),
    cell(fmtTime(e.at)),
    cell(e.sandbox_id, "id"),
    cell(e.kind),
    cell(clip(JSON.stringify(e.detail || {}), 300), "detail"),
  ]);
  body.insertBefore(tr, body.firstChild);
  while (body.rows.length > EVENTS_KEPT) body.deleteRow(body.rows.length - 1);
}

function noEventsYet(text) {
  if (events.lastSeq === null && events.empty) fill("events", [], text);
}

async function followEvents() {
  if (events.running) return;
  events.running = true;
  try {
    if (events.mode === "poll") await pollEvents();
    else await streamEvents();
  } catch (err) {
    $("events-state").textContent = "(disconnected: " + err.message + ")";
  } finally {
    // The next refresh reconnects (or polls) from the last event seen.
    events.running = false;
  }
}

async function streamEvents() {
  $("events-state").textContent = "(live)";
  noEventsYet("No events since the page was opened.");
  const path = events.lastSeq === null ? "/v1/events" : `/v1/events?since=${events.lastSeq}`;
  let res;
  try {
    res = await api(path, "text/event-stream");
  } catch (err) {
    if (err instanceof ApiError && err.status === 403) {
      events.mode = "poll";
      return pollEvents();
    }
    throw err;
  }
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let end;
    while ((end = buf.indexOf("\n\n")) >= 0) {
      const frame = buf.slice(0, end);
      buf = buf.slice(end + 2);
      const data = frame
        .split("\n")
        .filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).trimStart())
        .join("\n");
      if (!data) continue;
      const e = JSON.parse(data);
      addEvent(e);
      events.lastSeq = e.seq;
    }
  }
  $("events-state").textContent = "(stream ended; reconnecting)";
}

async function pollEvents() {
  $("events-state").textContent = "(your tenant's, every few seconds)";
  for (let page = 0; page < EVENT_PAGES; page += 1) {
    const list = await getJson(`/v1/events?since=${events.lastSeq || 0}&limit=${EVENT_PAGE}`);
    for (const e of list.slice(-EVENTS_KEPT)) addEvent(e);
    if (list.length > 0) events.lastSeq = list[list.length - 1].seq;
    if (list.length < EVENT_PAGE) break;
  }
  noEventsYet("No events yet.");
}

// ---- start ------------------------------------------------------------------

function start() {
  session.load();
  $("login").addEventListener("submit", (ev) => {
    ev.preventDefault();
    session.save($("token").value.trim());
    $("token").value = "";
    refresh();
  });
  $("signout").addEventListener("click", () => {
    session.save(null);
    refresh();
  });
  $("window").addEventListener("change", refresh);
  $("task").addEventListener("change", refresh);
  refresh();
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
else start();
