// The shardsink dashboard: polls /api/state once a second and draws it.
// Everything is built with DOM calls (textContent), never from HTML strings,
// so nothing a cluster reports is interpreted as markup.
"use strict";

const POLL_MS = 1000;
const WINDOW_S = 600;
const SVG = "http://www.w3.org/2000/svg";
const W = 600, H = 150, LEFT = 44, RIGHT = 8, TOP = 8, BOTTOM = 18;

function el(tag, attrs, text) {
  const node = tag.startsWith("svg:")
    ? document.createElementNS(SVG, tag.slice(4))
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function fmt(x, digits) {
  return x === null || x === undefined ? "-" : Number(x).toFixed(digits);
}

function mib(bytes) {
  return (bytes / 1048576).toFixed(1) + " MiB";
}

function clock(t) {
  return new Date(t * 1000).toLocaleTimeString([], { hour12: false });
}

// The processes as a tree: coordinator, consensus, then each group's builder
// with its workers under it.
function tree(processes) {
  const order = { coordinator: 0, consensus: 1, builder: 2, worker: 3 };
  const group = (p) => (p.kind === "builder" || p.kind === "worker" ? p.name.split("/")[0] : "");
  return [...processes].sort((a, b) =>
    group(a).localeCompare(group(b), undefined, { numeric: true }) ||
    order[a.kind] - order[b.kind] ||
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

function drawFigures(s) {
  const figures = [
    ["upper", s.upper.toLocaleString()],
    ["appends", s.appends.toLocaleString()],
    ["intervals / s", fmt(s.intervals_per_s, 2)],
    ["latency p50 / p99", `${fmt(s.append_latency_ms_p50, 1)} / ${fmt(s.append_latency_ms_p99, 1)} ms`],
    ["data parts / append", fmt(s.data_parts_per_append, 2)],
    ["blob PUTs / append", fmt(s.blob_puts_per_append, 2)],
    ["diff bytes / append", Math.round(s.diff_bytes_per_append).toLocaleString()],
    ["restarts", `${s.restarts} groups, ${s.consensus_restarts} consensus`],
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
}

// A line chart of samples[key] for each key over the last WINDOW_S seconds;
// a null value (no append in that second) breaks the line.
function drawChart(id, samples, keys, now) {
  const svg = document.getElementById(id);
  const values = samples.flatMap((s) => keys.map((k) => s[k])).filter((v) => v !== null);
  const top = Math.max(1e-9, ...values) * 1.1;
  const span = Math.min(WINDOW_S, Math.max(10, now - (samples.length ? samples[0].t : now)));
  const x = (t) => LEFT + (W - LEFT - RIGHT) * (1 - (now - t) / span);
  const y = (v) => TOP + (H - TOP - BOTTOM) * (1 - v / top);
  const nodes = [];
  for (const frac of [0, 0.5, 1]) {
    const v = (top / 1.1) * frac;
    nodes.push(el("svg:line", { class: "grid", x1: LEFT, x2: W - RIGHT, y1: y(v), y2: y(v) }));
    nodes.push(el("svg:text", { x: LEFT - 4, y: y(v) + 4, "text-anchor": "end" }, fmt(v, v < 10 ? 2 : 0)));
  }
  nodes.push(el("svg:text", { x: LEFT, y: H - 4 }, `-${Math.round(span)} s`));
  nodes.push(el("svg:text", { x: W - RIGHT, y: H - 4, "text-anchor": "end" }, "now"));
  keys.forEach((key, i) => {
    let d = "", pen = "M";
    for (const s of samples) {
      if (s[key] === null || now - s.t > span) { pen = "M"; continue; }
      d += `${pen}${x(s.t).toFixed(1)},${y(s[key]).toFixed(1)} `;
      pen = "L";
    }
    nodes.push(el("svg:path", { class: `series series-${i}`, "data-key": key, d: d.trim() }));
  });
  svg.replaceChildren(...nodes);
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
    document.getElementById("title").textContent = state.title;
    document.title = state.title;
    const now = Date.now() / 1000;
    if (state.status) {
      drawFigures(state.status);
      drawProcesses(state.status.processes);
      live.textContent = `live, updated ${clock(now)}`;
      live.className = "";
    } else {
      live.textContent = "no coordinator answers";
      live.className = "down";
    }
    drawChart("chart-rate", state.samples, ["intervals_per_s"], now);
    drawChart("chart-latency", state.samples, ["latency_ms_p50", "latency_ms_p99"], now);
    drawChart("chart-parts", state.samples, ["parts_per_append", "puts_per_append"], now);
    drawEvents(state.events);
  } catch (err) {
    live.textContent = "dashboard unreachable (the run has ended?)";
    live.className = "down";
  }
  setTimeout(poll, POLL_MS);
}

poll();
