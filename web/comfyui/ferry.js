// Ferry's ComfyUI frontend: a sidebar tab with live RAM/VRAM and, per offload (a diffusion
// model's, a text encoder's), what it is, where its weights are, the bytes moved, GB/s and
// stall time. Each line's title ("text encoder: t5xxl") comes from the server as it is shown. The server pushes `ferry.stats`
// about once a second while anything is offloaded; otherwise the tab polls /ferry/stats.
// Wiring (events, polling, settings) is kept apart from rendering (render* functions).
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { planSection } from "./ferry_plan.js";

const EXT = "Ferry.Sidebar";
const SETTING_POLL = "Ferry.Sidebar.PollSeconds";
const SETTING_PORT = "Ferry.Panel.Port";
const HISTORY = 60; // samples kept for the RAM/VRAM sparklines

const state = { last: null, lastAt: 0, history: [], root: null, timer: null, status: "" };

// -- formatting ------------------------------------------------------------------------
function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Number(n);
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return i === 0 ? `${v.toFixed(0)} B` : `${v.toFixed(2)} ${units[i]}`;
}

function fmtRate(gbps) {
  return gbps ? `${Number(gbps).toFixed(2)} GB/s` : "–";
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "style") Object.assign(node.style, v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

// -- rendering -------------------------------------------------------------------------
// The last HISTORY samples, scaled between their min and max (or 0..max when given), so a
// change of a few MiB is visible next to a GiB-sized total.
function sparkline(values, max) {
  const w = 220;
  const h = 28;
  const canvas = el("canvas", { width: w, height: h, class: "ferry-spark" });
  const ctx = canvas.getContext("2d");
  if (!ctx || values.length < 2) return canvas;
  const lo = max ? 0 : Math.min(...values);
  const span = (max || Math.max(...values)) - lo || 1;
  ctx.strokeStyle = "#4ea1ff";
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  values.forEach((v, i) => {
    const x = (i / (HISTORY - 1)) * w;
    const y = h - 2 - ((v - lo) / span) * (h - 4);
    if (i === 0) ctx.moveTo(x, y);
    else ctx.lineTo(x, y);
  });
  ctx.stroke();
  return canvas;
}

function row(label, value) {
  return el("div", { class: "ferry-row" }, el("span", { class: "ferry-label" }, label), el("span", { class: "ferry-value" }, value));
}

function renderMemory(s) {
  const box = el("div", { class: "ferry-section" }, el("h4", {}, "Memory"));
  if (s.vram) {
    const total = s.vram.total ? ` of ${fmtBytes(s.vram.total)}` : "";
    box.append(row(`VRAM (${s.device})`, `${fmtBytes(s.vram.allocated)} allocated${total}`));
    box.append(row("VRAM reserved", fmtBytes(s.vram.reserved)));
    if (s.vram.device_used !== null) box.append(row("VRAM used (all processes)", fmtBytes(s.vram.device_used)));
    box.append(sparkline(state.history.map((h) => h.vram || 0), s.vram.total));
  } else {
    box.append(row("VRAM", `no accelerator (${s.device || "cpu"})`));
  }
  if (s.ram) {
    box.append(row("RAM anon (process)", fmtBytes(s.ram.rss_anon)));
    box.append(row("RAM file-backed", fmtBytes(s.ram.rss_file)));
    box.append(row("RAM shared", fmtBytes(s.ram.rss_shmem)));
    box.append(row("RAM available (system)", fmtBytes(s.ram.system_available)));
    box.append(sparkline(state.history.map((h) => h.ram || 0)));
  }
  return box;
}

function renderOffload(o) {
  const what = { class: "ferry-card", "data-ferry-model": o.name, "data-ferry-kind": o.kind };
  if (o.error) return el("div", what, el("div", { class: "ferry-name" }, o.title), el("div", {}, o.error));
  const card = el(
    "div",
    what,
    el("div", { class: "ferry-name" }, o.title),
    row("level / tier", `${o.level} / ${o.tier}`),
    row("groups", `${o.groups} (${o.resident_groups} resident)`),
    row("prefetch", String(o.prefetch_depth)),
  );
  for (const [tier, bytes] of Object.entries(o.tiers || {})) card.append(row(`weights on ${tier}`, fmtBytes(bytes)));
  card.append(
    row("bytes moved", fmtBytes(o.bytes_moved)),
    row("host → device", fmtRate(o.h2d_gbps)),
    row("disk read", fmtRate(o.disk_gbps)),
    row("stall", `${Number(o.stall_s || 0).toFixed(3)} s`),
    row("transfer", `${Number(o.transfer_s || 0).toFixed(3)} s`),
    row("forwards", String(o.forwards)),
  );
  if (o.disk_read_last_prompt) card.append(row("read from disk (last prompt)", fmtBytes(o.disk_read_last_prompt)));
  if (o.why) card.append(el("div", { class: "ferry-why" }, o.why));
  return card;
}

function render() {
  const root = state.root;
  if (!root) return;
  const s = state.last;
  const age = s ? ((Date.now() - state.lastAt) / 1000).toFixed(0) : "–";
  const panelBtn = el("button", { class: "ferry-btn", onclick: openPanel }, "Open Ferry panel");
  const children = [
    el("div", { class: "ferry-head" }, el("b", {}, "Ferry"), el("span", { class: "ferry-age" }, s ? `updated ${age} s ago` : "waiting…")),
    panelBtn,
  ];
  if (state.status) children.push(el("div", { class: "ferry-status" }, state.status));
  if (s) {
    children.push(renderMemory(s));
    const models = el("div", { class: "ferry-section" }, el("h4", {}, `Offloaded (${s.offloads.length})`));
    if (!s.offloads.length) models.append(el("div", { class: "ferry-muted" }, "None live. A model through “Ferry Offload Model” lays out when it is first sampled, a text encoder through “Ferry Offload Text Encoder” when it first encodes."));
    for (const o of s.offloads) models.append(renderOffload(o));
    children.push(models);
  }
  root.replaceChildren(...children);
}

// -- wiring ----------------------------------------------------------------------------
function accept(stats) {
  if (!stats || typeof stats !== "object") return;
  state.last = stats;
  state.lastAt = Date.now();
  state.history.push({ vram: stats.vram ? stats.vram.allocated : null, ram: stats.ram ? stats.ram.rss_anon : null });
  if (state.history.length > HISTORY) state.history.shift();
  render();
}

async function poll() {
  try {
    const r = await api.fetchApi("/ferry/stats");
    if (r.ok) accept(await r.json());
  } catch (e) {
    state.status = `stats unavailable: ${e}`;
  }
}

function pollSeconds() {
  const v = Number(app.extensionManager?.setting?.get?.(SETTING_POLL) ?? 2);
  return Number.isFinite(v) && v >= 0.5 ? v : 2;
}

function startPolling() {
  stopPolling();
  // Pushed events arrive ~1/s while something is offloaded; poll only when they don't.
  state.timer = setInterval(() => {
    if (Date.now() - state.lastAt > pollSeconds() * 1000) poll();
    else render();
  }, 1000);
  poll();
}

function stopPolling() {
  if (state.timer) clearInterval(state.timer);
  state.timer = null;
}

async function openPanel() {
  state.status = "starting the panel…";
  render();
  const port = Number(app.extensionManager?.setting?.get?.(SETTING_PORT) ?? 0);
  const body = port > 0 ? { port } : {};
  try {
    const r = await api.fetchApi("/ferry/panel", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    const data = await r.json();
    if (r.ok && data.url) {
      state.status = `panel: ${data.url}`;
      window.open(data.url, "_blank");
    } else {
      state.status = `panel: ${data.error || r.statusText}`;
    }
  } catch (e) {
    state.status = `panel: ${e}`;
  }
  render();
}

const STYLE = `
.ferry-tab { padding: 8px 10px; font-size: 12px; line-height: 1.45; overflow-y: auto; height: 100%; }
.ferry-head { display: flex; justify-content: space-between; align-items: baseline; margin-bottom: 6px; font-size: 14px; }
.ferry-age, .ferry-muted { opacity: 0.65; font-size: 11px; }
.ferry-section { margin-top: 10px; }
.ferry-section h4 { margin: 4px 0; font-size: 12px; text-transform: uppercase; opacity: 0.8; }
.ferry-row { display: flex; justify-content: space-between; gap: 8px; }
.ferry-label { opacity: 0.75; white-space: nowrap; }
.ferry-value { font-variant-numeric: tabular-nums; text-align: right; white-space: nowrap; }
.ferry-name { font-weight: 600; overflow-wrap: anywhere; margin-bottom: 2px; }
.ferry-card { border: 1px solid rgba(128,128,128,0.35); border-radius: 6px; padding: 6px 8px; margin: 6px 0; }
.ferry-btn { margin: 4px 0; padding: 4px 10px; border-radius: 4px; cursor: pointer; }
.ferry-status { font-size: 11px; margin: 4px 0; word-break: break-all; }
.ferry-spark { display: block; margin: 2px 0 4px; }
.ferry-why { font-size: 11px; opacity: 0.85; margin-top: 3px; }
.ferry-fits { font-size: 11px; margin: 4px 0; color: #5c5; }
.ferry-plan { padding: 8px 10px 0; font-size: 12px; line-height: 1.45; }
`;

app.registerExtension({
  name: EXT,
  settings: [
    {
      id: SETTING_POLL,
      name: "Ferry sidebar: poll every N seconds when no live updates arrive",
      type: "number",
      defaultValue: 2,
      attrs: { min: 0.5, max: 60, step: 0.5 },
      tooltip: "Live updates are pushed about once a second while a model is offloaded.",
    },
    {
      id: SETTING_PORT,
      name: "Ferry panel: port (0 = first free port)",
      type: "number",
      defaultValue: 0,
      attrs: { min: 0, max: 65535, step: 1 },
      tooltip: "The Gradio panel listens on 127.0.0.1 at this port.",
    },
  ],
  setup() {
    document.head.append(el("style", { id: "ferry-style" }, STYLE));
    api.addEventListener("ferry.stats", (e) => accept(e.detail));
    app.extensionManager.registerSidebarTab({
      id: "ferry",
      icon: "pi pi-server",
      title: "Ferry",
      tooltip: "Ferry: offloading, RAM and VRAM",
      type: "custom",
      render(container) {
        state.root = el("div", { class: "ferry-tab", id: "ferry-sidebar" });
        // The plan section sits above the live part, in one scrolling column: render()
        // redraws only state.root, so a budget being typed keeps its focus.
        const column = el("div", { style: { height: "100%", overflowY: "auto" } }, planSection(), state.root);
        container.replaceChildren(column);
        startPolling();
        render();
      },
      destroy() {
        stopPolling();
        state.root = null;
      },
    });
  },
});
