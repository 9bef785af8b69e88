// The engine dashboard: draws each snapshot of /dashboard/events (JSON, see stage 04's watch/snapshot.py).
// Plain JS, canvas drawing, no library: the batch table, the block pool grid, the queues and
// a few line charts of the last HISTORY updates.
"use strict";

const HISTORY = 150;
const STATE_COLORS = {free: "#e6e6e6", cached: "#9ecae1", used: "#3182bd", shared: "#8e44ad", preempted: "#e6550d"};
const LINE_COLORS = ["#3182bd", "#e6550d", "#31a354", "#756bb1"];
const CHARTS = [
  {title: "step time, ms (stacked: schedule, draft, forward, sample)", stacked: true,
   lines: ["schedule", "draft", "forward", "sample"].map(p => [p, s => s.phases_ms[p]])},
  {title: "tokens per step", lines: [["tokens", s => s.tokens_per_step]]},
  {title: "output tok/s", lines: [["tok/s", s => s.output_tok_s]]},
  {title: "TTFT, ms", lines: [["p50", s => s.ttft_p50_ms], ["p99", s => s.ttft_p99_ms]]},
  {title: "TPOT, ms", lines: [["p50", s => s.tpot_p50_ms], ["p99", s => s.tpot_p99_ms]]},
  {title: "KV usage, %", max: 100, lines: [["used", s => 100 * s.kv_usage]]},
  {title: "speculation: accepted drafts, %", max: 100,
   lines: [["accepted", s => s.spec_acceptance === null ? null : 100 * s.spec_acceptance]]},
];

const points = [];        // the series point of each update
const arrivals = [];      // when updates came (ms), for updates/s
let lastPreemption = null;

function $(id) { return document.getElementById(id); }

function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

function fmt(x, digits) {
  if (x === null || x === undefined) return "–";
  return Number(x).toFixed(digits === undefined ? 1 : digits);
}

function renderStats(snap) {
  const q = snap.queues;
  $("stat-running").textContent = snap.num_running;
  $("stat-waiting").textContent = q.waiting.count;
  $("stat-paused").textContent = q.paused.count;
  $("stat-preempted").textContent = q.preempted.count;
  $("stat-preemptions").textContent = snap.totals.preemptions;
  $("stat-refusals").textContent = snap.totals.refusals;
  const now = performance.now();
  arrivals.push(now);
  while (arrivals.length && arrivals[0] < now - 2000) arrivals.shift();
  $("stat-updates").textContent = fmt(arrivals.length / 2, 1);
  const e = snap.engine;
  $("engine-info").textContent = `${e.num_blocks} blocks of ${e.block_size} tokens · batch ≤ ${e.max_num_seqs} ` +
    `requests, ${e.max_num_batched_tokens} tokens · policy ${e.policy} · speculation ${e.speculative}`;
}

function renderRows(snap) {
  const body = $("rows");
  const budget = snap.engine.max_num_batched_tokens;
  body.replaceChildren(...snap.running.map(r => {
    const tr = el("tr", null, {"data-request-id": r.id, "data-kind": r.kind});
    tr.append(el("td", "#" + r.id));
    const kind = el("td", null, {class: "kind"});
    kind.append(el("span", r.kind, {class: r.kind}));
    tr.append(kind);
    const tokens = el("td");
    tokens.append(el("span", null, {class: "bar", style: `width:${Math.max(1, 80 * r.tokens / budget)}px`}),
                  document.createTextNode(r.tokens));
    tr.append(tokens);
    tr.append(el("td", r.drafted ? `${r.drafted} / ${r.accepted}` : "–"));
    tr.append(el("td", r.grammar ? "on" : ""));
    tr.append(el("td", r.level === null ? r.priority : `L${r.level}`));
    tr.append(el("td", `${r.prompt_tokens} + ${r.output_tokens}`));
    tr.append(el("td", r.blocks));
    return tr;
  }));
  const hidden = snap.num_running - snap.running.length;
  $("rows-more").textContent = hidden > 0 ? `and ${hidden} more` : (snap.num_running ? "" : "no request running");
}

function renderPool(snap) {
  const pool = snap.pool, canvas = $("pool"), ctx = canvas.getContext("2d");
  const cols = Math.max(1, Math.ceil(Math.sqrt(pool.cells * canvas.width / canvas.height)));
  const rows = Math.ceil(pool.cells / cols);
  const size = Math.max(1, Math.floor(Math.min(canvas.width / cols, canvas.height / rows)));
  const gap = size > 4 ? 1 : 0;
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  let cell = 0;
  const place = c => [(c % cols) * size, Math.floor(c / cols) * size];
  for (let i = 0; i < pool.runs.length; i += 2) {
    ctx.fillStyle = STATE_COLORS[pool.states[pool.runs[i]]];
    for (let end = cell + pool.runs[i + 1]; cell < end; cell++) {
      const [x, y] = place(cell);
      ctx.fillRect(x, y, size - gap, size - gap);
    }
  }
  // blocks a preemption freed since the last update: outlined, over whatever holds them now
  ctx.strokeStyle = STATE_COLORS.preempted;
  ctx.lineWidth = Math.max(1, Math.min(4, size / 5));
  for (const c of pool.preempted_cells) {
    const [x, y] = place(c), inset = ctx.lineWidth / 2;
    ctx.strokeRect(x + inset, y + inset, size - gap - 2 * inset, size - gap - 2 * inset);
  }
  canvas.dataset.signature = pool.runs.join(",") + "|" + pool.preempted_cells.join(",");
  const legend = $("pool-legend");
  legend.replaceChildren(...[...pool.states, "preempted"].map(name => {
    const item = el("span", null, {"data-state": name});
    const label = name === "preempted" ? "freed by a preemption (outlined)" : name;
    item.append(el("span", null, {class: "swatch", style: `background:${STATE_COLORS[name]}`}),
                document.createTextNode(`${label} ${pool.counts[name]}`));
    return item;
  }));
  if (pool.group > 1) legend.append(el("span", `(one cell = ${pool.group} blocks)`, {class: "muted"}));
  if (snap.preempted_now.length) {
    lastPreemption = {ids: snap.preempted_now, blocks: pool.counts.preempted, at: performance.now()};
  }
  const line = $("last-preemption");
  if (lastPreemption) {
    const ago = (performance.now() - lastPreemption.at) / 1000;
    line.textContent = `last preemption: request ${lastPreemption.ids.map(i => "#" + i).join(", ")}, ` +
      `${lastPreemption.blocks} blocks freed, ${fmt(ago, 1)} s ago`;
    line.className = ago < 1.5 ? "flash" : "muted";
  }
}

function renderQueues(snap) {
  const box = $("queues");
  box.replaceChildren(...Object.entries(snap.queues).map(([name, q]) => {
    const div = el("div", null, {"data-queue": name});
    div.append(el("b", `${name}: ${q.count} `));
    for (const id of q.ids) div.append(el("span", "#" + id, {class: "chip"}));
    if (q.count > q.ids.length) div.append(el("span", `… ${q.count - q.ids.length} more`, {class: "muted"}));
    return div;
  }));
  box.append(el("div", `refused with 429 so far: ${snap.totals.refusals}; paused so far: ${snap.totals.pauses}`,
                {class: "muted"}));
}

function makeCharts() {
  for (const chart of CHARTS) {
    const fig = el("figure");
    chart.caption = el("figcaption", chart.title);
    chart.canvas = el("canvas", null, {width: 250, height: 80});
    fig.append(chart.caption, chart.canvas);
    $("charts").append(fig);
  }
}

function drawChart(chart) {
  const ctx = chart.canvas.getContext("2d"), w = chart.canvas.width, h = chart.canvas.height;
  const values = chart.lines.map(([, get]) => points.map(p => { const v = get(p); return v === null || v === undefined ? null : v; }));
  const stacks = chart.stacked ? values.map((_, i) => points.map((_, t) =>
    values.slice(0, i + 1).reduce((sum, line) => sum + (line[t] || 0), 0))) : values;
  const top = chart.max || Math.max(1e-9, ...stacks.flat().filter(v => v !== null));
  const span = Math.max(30, points.length - 1);  // x spacing: a short history still fills the chart
  ctx.clearRect(0, 0, w, h);
  ctx.strokeStyle = "#ddd";
  ctx.strokeRect(0.5, 0.5, w - 1, h - 1);
  stacks.forEach((line, i) => {
    ctx.strokeStyle = LINE_COLORS[i % LINE_COLORS.length];
    ctx.beginPath();
    let pen = false;
    line.forEach((v, t) => {
      if (v === null) { pen = false; return; }
      const x = w - 1 - (points.length - 1 - t) * (w - 2) / span, y = h - 2 - (h - 4) * v / top;
      if (pen) ctx.lineTo(x, y); else ctx.moveTo(x, y);
      pen = true;
    });
    ctx.stroke();
  });
  const last = chart.lines.map(([name], i) => `${name} ${fmt(values[i][values[i].length - 1])}`);
  chart.caption.textContent = `${chart.title} · ${last.join(" · ")} · max ${fmt(top)}`;
}

function render(snap) {
  points.push(snap.series);
  if (points.length > HISTORY) points.shift();
  renderStats(snap);
  renderRows(snap);
  renderPool(snap);
  renderQueues(snap);
  CHARTS.forEach(drawChart);
  document.body.dataset.rendered = (Number(document.body.dataset.rendered) || 0) + 1;  // snapshots drawn
}

// The event stream, read with fetch: EventSource cannot send the Authorization header a server
// started with --api-key wants. The key, typed once, stays in this tab (sessionStorage).
const KEY = "dashboard-api-key";

async function readEvents(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {  // one event; ": idle" keep-alives carry no data
      const lines = buffer.slice(0, end).split("\n");
      buffer = buffer.slice(end + 2);
      const data = lines.filter(line => line.startsWith("data: ")).map(line => line.slice(6)).join("\n");
      if (!data) continue;
      try {  // a drawing bug is the page's, not the stream's: report it (the console) and read on
        render(JSON.parse(data));
      } catch (error) {
        reportError(error);
      }
    }
  }
}

// A disaggregated server's engines are its workers: the page reads one at a time, picked in
// the header (or with ?worker=NAME in the page's address).
let worker = new URLSearchParams(location.search).get("worker");
let reading = null;  // the AbortController of the stream being read

async function listWorkers(headers) {
  const response = await fetch("/dashboard/workers", {headers});
  if (!response.ok) return;  // a refused key shows at the stream's read, next
  const names = (await response.json()).workers;
  if (!names.length) return;  // one engine: no picker
  if (!names.includes(worker)) worker = names[0];
  const select = $("worker");
  select.replaceChildren(...names.map(name => el("option", name, {value: name})));
  select.value = worker;
  select.hidden = false;
}

$("worker").addEventListener("change", () => {
  worker = $("worker").value;
  points.length = 0;  // another engine: its history starts here
  arrivals.length = 0;
  lastPreemption = null;
  if (reading) reading.abort();  // connect() reads the new one at once
});

async function connect() {
  const status = $("status");
  for (;;) {
    const key = sessionStorage.getItem(KEY);
    const headers = key ? {Authorization: `Bearer ${key}`} : {};
    reading = new AbortController();
    try {
      if ($("worker").hidden) await listWorkers(headers);
      const url = "/dashboard/events" + (worker && !$("worker").hidden ? `?worker=${encodeURIComponent(worker)}` : "");
      const response = await fetch(url, {headers, signal: reading.signal});
      if (response.status === 401) {  // the server wants a key: ask, and try again when it is given
        status.textContent = key ? "that key was refused" : "this server needs its API key";
        status.className = "down";
        $("key-form").hidden = false;
        return;
      }
      if (!response.ok) throw new Error(`${url} answered ${response.status}`);
      status.textContent = "live";
      status.className = "live";
      await readEvents(response.body);
    } catch (error) {
      if (reading.signal.aborted) continue;  // another worker was picked: read it now
      // the server went away or restarts: retry below
    }
    status.textContent = "disconnected, retrying…";
    status.className = "down";
    await new Promise(resolve => setTimeout(resolve, 1000));
  }
}

$("key-form").addEventListener("submit", event => {
  event.preventDefault();
  sessionStorage.setItem(KEY, $("key").value);
  $("key-form").hidden = true;
  connect();
});

makeCharts();
connect();
