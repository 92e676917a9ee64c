// The shardsink dashboard: polls /api/state once a second and draws it.
// Everything is built with DOM calls (textContent), never from HTML strings,
// so nothing a cluster reports is interpreted as markup.
"use strict";

const POLL_MS = 1000;
const SVG = "http://www.w3.org/2000/svg";
const W = 600, H = 170, LEFT = 52, RIGHT = 10, TOP = 10, BOTTOM = 34;
// Time-axis steps (seconds) the ticks may take: the first giving at most 6 ticks.
const STEPS = [5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600];
// Where the pointer is over each chart (clientX), so a redraw keeps its values shown.
const HOVER = {};
// Process kinds in the memory chart's order (others after, by name).
const KINDS = ["coordinator", "consensus", "builder", "worker"];

// Every chart: its svg id, its y-axis unit and its series (a sample's value, a label).
const CHARTS = {
  "chart-rate": { unit: "intervals/s", series: [
    { label: "intervals/s", value: (s) => s.intervals_per_s, digits: 2 }] },
  "chart-backlog": { unit: "intervals", series: [
    { label: "backlog", value: (s) => s.backlog, digits: 0 }] },
  "chart-rows": { unit: "rows/s", series: [
    { label: "rows/s", value: (s, plan) => plan.rows_per_interval === null ? null
        : s.intervals_per_s * plan.rows_per_interval, digits: 0 }] },
  "chart-latency": { unit: "ms", series: [
    { label: "p50", value: (s) => s.latency_ms_p50, digits: 1 },
    { label: "p99", value: (s) => s.latency_ms_p99, digits: 1, dash: true }] },
  "chart-parts": { unit: "data parts / append", series: [
    { label: "data parts", value: (s) => s.parts_per_append, digits: 2 }] },
  "chart-puts": { unit: "blob PUTs / append", series: [
    { label: "blob PUTs", value: (s) => s.puts_per_append, digits: 2 }] },
};

function el(tag, attrs, text) {
  const node = tag.startsWith("svg:")
    ? document.createElementNS(SVG, tag.slice(4))
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function fmt(x, digits) {
  return x === null || x === undefined ? "-" : Number(x).toLocaleString(undefined, {
    minimumFractionDigits: digits, maximumFractionDigits: digits });
}

function mib(bytes) {
  return (bytes / 1048576).toFixed(1) + " MiB";
}

function clock(t) {
  return new Date(t * 1000).toLocaleTimeString([], { hour12: false });
}

function duration(s) {
  if (!isFinite(s)) return "-";
  s = Math.round(s);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  return h ? `${h} h ${m} min` : m ? `${m} min ${sec} s` : `${sec} s`;
}

// The processes as a tree: coordinator, consensus, then each group's builder
// with its workers under it.
function tree(processes) {
  const order = { coordinator: 0, consensus: 1, builder: 2, worker: 3 };
  const group = (p) => (p.kind === "builder" || p.kind === "worker" ? p.name.split("/")[0] : "");
  return [...processes].sort((a, b) =>
    group(a).localeCompare(group(b), undefined, { numeric: true }) ||
    (order[a.kind] ?? 9) - (order[b.kind] ?? 9) ||
    a.name.localeCompare(b.name, undefined, { numeric: true }));
}

function drawProcesses(processes) {
  const body = document.querySelector("#processes tbody");
  body.replaceChildren(...tree(processes).map((p) => {
    const depth = { coordinator: 0, consensus: 1, builder: 1, worker: 2 }[p.kind] ?? 0;
    const row = el("tr", { class: `depth-${depth}`, "data-pid": p.pid, "data-kind": p.kind });
    row.append(
      el("td", {}, p.kind),
      el("td", {}, p.name),
      el("td", { class: "num" }, String(p.pid)),
      el("td", { class: p.alive ? "alive" : "dead" }, p.alive ? "alive" : "exited"),
      el("td", { class: "num" }, p.alive ? mib(p.rss_bytes) : "-"),
      el("td", { class: "num" }, p.alive ? fmt(p.cpu_percent, 1) : "-"),
    );
    return row;
  }));
}

// The hosts a Ray cluster's groups run on, when the status lists them (as
// `shardsink status` does: only hosts of a Ray cluster, with a node id).
function drawHosts(hosts) {
  const section = document.getElementById("hosts-section");
  section.hidden = !(hosts || []).some((h) => h.node_id);
  if (section.hidden) return;
  document.querySelector("#hosts tbody").replaceChildren(...hosts.map((h) => {
    const row = el("tr", { "data-node": h.node_id || "" });
    row.append(
      el("td", {}, h.name ?? h.hostname ?? `host ${h.index ?? ""}`),
      el("td", {}, (h.node_id || "-").slice(0, 12)),
      el("td", {}, h.address || "-"),
      el("td", {}, (h.groups || []).join(", ") || "-"),
      el("td", { class: h.alive ? "alive" : "dead" }, h.alive ? "alive" : "lost"),
      el("td", { class: "num" }, String(h.restarts ?? 0)),
    );
    return row;
  }));
}

function drawProgress(s, plan) {
  const bar = document.getElementById("progress-bar");
  const text = document.getElementById("progress-text");
  if (plan.intervals === null || plan.intervals === undefined || plan.intervals <= 0) {
    bar.value = 0;
    bar.hidden = true;
    text.textContent = `${s.appends.toLocaleString()} intervals appended (no end set)`;
    return;
  }
  const done = Math.min(s.appends, plan.intervals);
  bar.hidden = false;
  bar.max = plan.intervals;
  bar.value = done;
  const left = plan.intervals - done;
  const eta = s.intervals_per_s > 0 ? left / s.intervals_per_s : Infinity;
  text.textContent = `${done.toLocaleString()} of ${plan.intervals.toLocaleString()} intervals ` +
    `(${(100 * done / plan.intervals).toFixed(1)}%)` +
    (left === 0 ? ", done" : `, about ${duration(eta)} left at ${fmt(s.intervals_per_s, 2)}/s`);
}

function failures(m) {
  if (!m.known) return "unknown";
  const kinds = Object.entries(m.counts);
  return kinds.length ? kinds.map(([kind, n]) => `${kind} ${n}`).join(", ") : "none";
}

function drawFigures(s, plan) {
  const rows = plan.rows_per_interval === null ? null : s.intervals_per_s * plan.rows_per_interval;
  const figures = [
    ["upper", s.upper.toLocaleString()],
    ["appends", s.appends.toLocaleString()],
    ["intervals / s", fmt(s.intervals_per_s, 2)],
    ["rows / s", rows === null ? "-" : fmt(rows, 0)],
    ["latency p50 / p99", `${fmt(s.append_latency_ms_p50, 1)} / ${fmt(s.append_latency_ms_p99, 1)} ms`],
    ["data parts / append", fmt(s.data_parts_per_append, 2)],
    ["blob PUTs / append", fmt(s.blob_puts_per_append, 2)],
    ["diff bytes / append", Math.round(s.diff_bytes_per_append).toLocaleString()],
    ["restarts", `${s.restarts} groups, ${s.consensus_restarts} consensus`],
    ["maintenance failures", failures(s.maintenance_failures)],
  ];
  document.getElementById("figures").replaceChildren(...figures.map(([name, value]) => {
    const box = el("div");
    box.append(el("dt", {}, name), el("dd", {}, value));
    return box;
  }));
  document.getElementById("shape").textContent =
    `${s.cluster_id}: ${s.groups}x${s.workers} ${s.mode}, ${s.workload} (${s.pace}), shard ${s.shard}`;
  const links = [`consensus ${s.consensus}`, `data dir ${s.data_dir}`];
  if (s.metrics) links.push(`metrics ${s.metrics}`);
  document.getElementById("addresses").textContent = links.join(" \u00b7 ");
  for (const node of document.querySelectorAll(".window")) {
    node.textContent = `each point: the status's last ${Math.round(s.window_s)} s`;
  }
}

function niceTop(v) {
  if (v <= 0) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  return [1, 2, 4, 8, 10].map((m) => m * p).find((m) => m >= v);
}

// The fewest decimals (up to 3) that write ``step`` and its multiples exactly.
function decimals(step) {
  return [0, 1, 2, 3].find((k) => Math.abs(step * 10 ** k - Math.round(step * 10 ** k)) < 1e-6) ?? 3;
}

// A line chart of each series over the samples held, against wall-clock time:
// ticks at round times, labelled with the time of day; a null value (nothing
// appended since the previous sample) breaks the line. Hovering shows the
// values of the sample nearest the pointer.
function drawChart(id, samples, spec, plan) {
  const svg = document.getElementById(id);
  const series = spec.series;
  const rows = samples.map((s) => ({ t: s.t, v: series.map((k) => k.value(s, plan)) }));
  const values = rows.flatMap((r) => r.v).filter((v) => v !== null && v !== undefined);
  const top = niceTop(Math.max(0, ...values) * 1.05);
  const t1 = samples.length ? samples[samples.length - 1].t : Date.now() / 1000;
  const t0 = Math.min(samples.length ? samples[0].t : t1, t1 - 10);
  const x = (t) => LEFT + (W - LEFT - RIGHT) * ((t - t0) / (t1 - t0));
  const y = (v) => TOP + (H - TOP - BOTTOM) * (1 - v / top);
  const nodes = [];
  for (const frac of [0, 0.25, 0.5, 0.75, 1]) {
    const v = top * frac;
    nodes.push(el("svg:line", { class: "grid", x1: LEFT, x2: W - RIGHT, y1: y(v), y2: y(v) }));
    nodes.push(el("svg:text", { x: LEFT - 4, y: y(v) + 4, "text-anchor": "end" },
      fmt(v, decimals(top / 4))));
  }
  const step = STEPS.find((s) => (t1 - t0) / s <= 6) ?? STEPS[STEPS.length - 1];
  for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
    if (x(t) < LEFT + 24) continue; // its label would sit on the y axis's
    nodes.push(el("svg:line", { class: "tick", x1: x(t), x2: x(t), y1: H - BOTTOM, y2: H - BOTTOM + 4 }));
    nodes.push(el("svg:text", { class: "time", x: x(t), y: H - BOTTOM + 15, "text-anchor": "middle" },
      clock(t)));
  }
  nodes.push(el("svg:text", { x: W - RIGHT, y: H - 3, "text-anchor": "end" },
    `time of day (${duration(t1 - t0)} shown)`));
  nodes.push(el("svg:text", { x: 4, y: TOP + 2, transform: `rotate(90 4 ${TOP + 2})` }, spec.unit));
  series.forEach((k, i) => {
    let d = "", pen = "M";
    for (const r of rows) {
      if (r.v[i] === null || r.v[i] === undefined) { pen = "M"; continue; }
      d += `${pen}${x(r.t).toFixed(1)},${y(r.v[i]).toFixed(1)} `;
      pen = "L";
    }
    const cls = `series series-${k.color ?? i}${k.dash ? " dashed" : ""}`;
    nodes.push(el("svg:path", { class: cls, "data-key": k.label, d: d.trim() }));
  });
  const cursor = el("svg:line", { class: "cursor", y1: TOP, y2: H - BOTTOM, visibility: "hidden" });
  const tip = el("svg:text", { class: "tip", y: TOP + 12, visibility: "hidden" });
  nodes.push(cursor, tip);
  svg.replaceChildren(...nodes);
  const show = (clientX) => {
    if (!rows.length) return;
    const box = svg.getBoundingClientRect();
    const at = t0 + ((clientX - box.left) * W / box.width - LEFT) / (W - LEFT - RIGHT) * (t1 - t0);
    const near = rows.reduce((a, b) => (Math.abs(b.t - at) < Math.abs(a.t - at) ? b : a));
    const px = x(near.t);
    cursor.setAttribute("x1", px);
    cursor.setAttribute("x2", px);
    cursor.setAttribute("visibility", "visible");
    tip.textContent = `${clock(near.t)}  ` +
      series.map((k, i) => `${k.label} ${fmt(near.v[i], k.digits)}`).join("  ");
    const right = px > W / 2;
    tip.setAttribute("x", right ? px - 6 : px + 6);
    tip.setAttribute("text-anchor", right ? "end" : "start");
    tip.setAttribute("visibility", "visible");
  };
  svg.onmousemove = (event) => { HOVER[id] = event.clientX; show(event.clientX); };
  svg.onmouseleave = () => {
    delete HOVER[id];
    cursor.setAttribute("visibility", "hidden");
    tip.setAttribute("visibility", "hidden");
  };
  if (id in HOVER) show(HOVER[id]);
}

// Memory per process kind: a series for each kind seen, in MiB.
function memorySpec(samples) {
  const seen = new Set(samples.flatMap((s) => Object.keys(s.rss_by_kind || {})));
  const kinds = [...KINDS.filter((k) => seen.has(k)), ...[...seen].filter((k) => !KINDS.includes(k)).sort()];
  const legend = document.getElementById("legend-memory");
  legend.replaceChildren(...kinds.map((k, i) => el("span", { class: `k${i}` }, k)));
  return { unit: "MiB", series: kinds.map((k, i) => ({
    label: k, color: i, digits: 1,
    value: (s) => (s.rss_by_kind && k in s.rss_by_kind ? s.rss_by_kind[k] / 1048576 : null) })) };
}

function drawEvents(events) {
  document.getElementById("events").replaceChildren(...events.slice().reverse().map((e) => {
    const item = el("li", { class: e.kind });
    item.append(el("time", {}, clock(e.t)), el("span", { class: "kind" }, e.kind), e.text);
    return item;
  }));
}

async function poll() {
  const live = document.getElementById("live");
  try {
    const response = await fetch("/api/state", { cache: "no-store" });
    const state = await response.json();
    const plan = { intervals: null, rows_per_interval: null, ...(state.plan || {}) };
    document.getElementById("title").textContent = state.title;
    document.title = state.title;
    if (state.status) {
      drawFigures(state.status, plan);
      drawProgress(state.status, plan);
      drawProcesses(state.status.processes);
      drawHosts(state.status.hosts);
      live.textContent = `live, updated ${clock(Date.now() / 1000)}`;
      live.className = "";
    } else {
      live.textContent = "no coordinator answers";
      live.className = "down";
    }
    document.getElementById("rows-section").hidden = plan.rows_per_interval === null;
    for (const [id, spec] of Object.entries(CHARTS)) drawChart(id, state.samples, spec, plan);
    drawChart("chart-memory", state.samples, memorySpec(state.samples), plan);
    drawEvents(state.events);
  } catch (err) {
    live.textContent = "dashboard unreachable (the run has ended?)";
    live.className = "down";
  }
  setTimeout(poll, POLL_MS);
}

poll();
