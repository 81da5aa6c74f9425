// Loads the daemon's dashboard in jsdom (its script and style fetched from
// the daemon, the page's API calls made with Node's fetch) and checks what
// it shows against what the test set up. Run by tests/dashboard.rs:
//
//   node check.cjs admin BASE TOKEN SANDBOX_ID TASK_LABEL HOSTILE_LABEL
//   node check.cjs tenant BASE API_KEY SANDBOX_ID
//
// Prints one JSON line of what it saw and exits 0, or prints why and exits 1.
"use strict";

const path = require("path");

const modules = process.env.MAYFLY_NODE_MODULES;
if (!modules) {
  console.error("MAYFLY_NODE_MODULES is not set");
  process.exit(2);
}
const { JSDOM, VirtualConsole } = require(path.resolve(modules, "jsdom"));

const [mode, base, token, sandboxId, taskLabel, hostileLabel] = process.argv.slice(2);

function fail(msg, dom) {
  const el = (id) => (dom ? dom.window.document.getElementById(id).textContent : "");
  console.error(`dashboard check failed: ${msg} (page status: ${el("status")}; events: ${el("events-state")})`);
  process.exit(1);
}

async function open(fragment, errors) {
  const virtualConsole = new VirtualConsole();
  virtualConsole.on("jsdomError", (e) => errors.push(String(e.message || e)));
  virtualConsole.on("error", (e) => errors.push(String(e)));
  return JSDOM.fromURL(`${base}/dashboard${fragment}`, {
    runScripts: "dangerously",
    resources: "usable",
    pretendToBeVisual: true,
    virtualConsole,
    beforeParse(window) {
      // jsdom has no fetch: lend it Node's, resolved against the page.
      window.fetch = (input, init) => fetch(new URL(input, window.location.href), init);
      window.TextDecoder = TextDecoder;
    },
  });
}

async function until(what, dom, ok, ms = 20000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = ok(dom.window.document);
    if (v) return v;
    if (Date.now() > deadline) fail(`timed out waiting for ${what}`, dom);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const text = (doc, sel) => [...doc.querySelectorAll(sel)].map((e) => e.textContent);

async function api(method, p, body) {
  const res = await fetch(base + p, {
    method,
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!res.ok) fail(`${method} ${p}: ${res.status} ${await res.text()}`);
  return res.json();
}

// A tenant's key: only its own sandboxes and events (paged, as the live
// stream is for admins).
async function tenantView() {
  const errors = [];
  const dom = await open(`#token=${encodeURIComponent(token)}`, errors);
  const doc = dom.window.document;
  await until("the tenant's sandbox", dom, (d) => text(d, "#sandboxes td.id").includes(sandboxId));
  await until("the tenant's claim in the events", dom, (d) =>
    [...d.querySelectorAll("#events tbody tr")].some(
      (tr) => tr.cells.length > 3 && tr.cells[2].textContent === sandboxId,
    ),
  );
  const seen = {
    ids: text(doc, "#sandboxes td.id"),
    live: doc.getElementById("live").textContent,
    pools: [...doc.querySelectorAll("#pools tbody tr")].map((tr) => tr.cells[0].textContent),
    event_sandboxes: [...new Set(text(doc, "#events tbody td.id"))],
    events_state: doc.getElementById("events-state").textContent,
    status: doc.getElementById("status").textContent,
    errors,
  };
  dom.window.close();
  console.log(JSON.stringify(seen));
  process.exit(0);
}

(async () => {
  if (mode === "tenant") return tenantView();
  if (mode !== "admin") fail(`unknown mode ${mode}`);
  const seen = {};
  const errors = [];

  // A wrong token: the page asks for one and says why.
  const bad = await open("#token=wrong-token", errors);
  const why = await until("the sign-in form", bad, (d) =>
    !d.getElementById("login").hidden && d.getElementById("main").hidden && d.getElementById("login-why").textContent,
  );
  seen.wrong_token = why;
  bad.window.close();

  // The right token, passed in the fragment.
  const dom = await open(`#token=${encodeURIComponent(token)}`, errors);
  const doc = dom.window.document;
  await until("the sandbox in the live table", dom, (d) => text(d, "#sandboxes td.id").includes(sandboxId));
  seen.fragment_after_load = dom.window.location.hash;
  seen.token_stored = dom.window.sessionStorage.getItem("mayfly.token") === token;
  seen.live = doc.getElementById("live").textContent;
  const usageRow = await until("usage of the sandbox", dom, (d) => {
    const r = [...d.querySelectorAll("#sandboxes tbody tr")].find((tr) => tr.cells[0].textContent === sandboxId);
    return r && r.cells[8].textContent.endsWith("iB") ? r : null;
  });
  seen.sandbox_row = [...usageRow.cells].map((c) => c.textContent);
  seen.pools = [...doc.querySelectorAll("#pools tbody tr")].map((tr) => [...tr.cells].map((c) => c.textContent));
  seen.pool_spin = doc.getElementById("pool-spin").textContent;
  seen.pool_spin_sub = doc.getElementById("pool-spin-sub").textContent;
  seen.cold_spin = doc.getElementById("cold-spin").textContent;
  seen.execs = doc.getElementById("execs").textContent;
  seen.tasks = [...doc.querySelectorAll("#tasks tbody tr")].map((tr) => [...tr.cells].slice(0, 5).map((c) => c.textContent));
  seen.chart_series = [...doc.querySelectorAll("#spin-chart path")]
    .filter((p) => p.getAttribute("d"))
    .map((p) => p.getAttribute("data-series"));
  seen.task_bars = doc.querySelectorAll("#tasks svg rect").length;
  // The hostile label is shown as text and made no element.
  seen.hostile_shown = text(doc, "#tasks td").includes(hostileLabel);
  seen.img_elements = doc.querySelectorAll("img").length;

  // A sandbox created now shows up in the live event stream.
  const created = await api("POST", "/v1/sandboxes", { labels: { task: taskLabel } });
  // From a pool it is `claimed`; booted for the request, `ready`.
  await until("the new sandbox's claimed or ready event", dom, (d) =>
    [...d.querySelectorAll("#events tbody tr")].some(
      (tr) => tr.cells.length > 3 && tr.cells[2].textContent === created.id && ["claimed", "ready"].includes(tr.cells[3].textContent),
    ),
  );
  await api("DELETE", `/v1/sandboxes/${created.id}`);
  await until("the new sandbox's destroyed event", dom, (d) =>
    [...d.querySelectorAll("#events tbody tr")].some(
      (tr) => tr.cells.length > 3 && tr.cells[2].textContent === created.id && /destroy/.test(tr.cells[3].textContent),
    ),
  );
  seen.event_kinds = [...new Set(text(doc, "#events tbody tr td:nth-child(4)"))].sort();
  seen.status = doc.getElementById("status").textContent;
  seen.errors = errors;
  dom.window.close();
  console.log(JSON.stringify(seen));
  process.exit(0);
})().catch((e) => fail(String(e && e.stack ? e.stack : e)));
