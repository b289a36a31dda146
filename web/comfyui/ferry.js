// Ferry's ComfyUI frontend: a sidebar tab with live RAM/VRAM and, per offload (a diffusion
// model's, a text encoder's), what it is, where its weights are, the bytes moved, GB/s and
// stall time. Each line's title ("text encoder: t5xxl") comes from the server as it is shown. The server pushes `ferry.stats`
// about once a second while anything is offloaded; otherwise the tab polls /ferry/stats.
// Wiring (events, polling, settings) is kept apart from rendering (render* functions).
// Every word shown goes through t(): the pack's locales/<lang>/main.json ("ferry.sidebar"),
// settings.json and nodeDefs.json, which core serves merged at GET /i18n.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { el, fmtBytes } from "./ferry_dom.js";
import { planSection } from "./ferry_plan.js";
import { groupStrip } from "./ferry_pictures.js";

const EXT = "Ferry.Sidebar";
const SETTING_POLL = "Ferry.Sidebar.PollSeconds";
const SETTING_PORT = "Ferry.Panel.Port";
const HISTORY = 60; // samples kept for the RAM/VRAM sparklines

const state = { last: null, lastAt: 0, history: [], root: null, timer: null, status: "" };

// -- words -----------------------------------------------------------------------------
// The frontend offers extensions no t(), so the tab reads the same locale files the frontend
// merges (core's GET /i18n) once, and picks the user's language (the Comfy.Locale setting,
// else the browser's) on every render: a word missing there falls back to English, then to
// its key.
const MESSAGES = await loadMessages();

async function loadMessages() {
  try {
    const r = await api.fetchApi("/i18n");
    if (r.ok) return await r.json();
  } catch (e) {
    console.warn("Ferry: no translations from /i18n", e);
  }
  return {};
}

function locale() {
  const chosen = app.extensionManager?.setting?.get?.("Comfy.Locale") || navigator.language || "en";
  if (MESSAGES[chosen]) return chosen;
  return String(chosen).split("-")[0];
}

function lookup(lang, path) {
  return path.split(".").reduce((o, k) => (o && typeof o === "object" ? o[k] : undefined), MESSAGES[lang]);
}

function t(key, vars = {}) {
  const path = `ferry.sidebar.${key}`;
  const text = lookup(locale(), path) ?? lookup("en", path) ?? key;
  return String(text).replace(/\{(\w+)\}/g, (m, name) => (name in vars ? String(vars[name]) : m));
}

function settingText(id, field) {
  // settings.json, keyed as the frontend keys it (dots -> underscores); the frontend shows the
  // user's language itself and falls back to this English text.
  return lookup("en", `settings.${id.replace(/\./g, "_")}.${field}`) ?? id;
}

// -- formatting ------------------------------------------------------------------------

function fmtRate(gbps) {
  return gbps ? `${Number(gbps).toFixed(2)} GB/s` : "–";
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
  const box = el("div", { class: "ferry-section" }, el("h4", {}, t("memory")));
  if (s.vram) {
    const allocated = fmtBytes(s.vram.allocated);
    const used = s.vram.total ? t("allocatedOf", { allocated, total: fmtBytes(s.vram.total) }) : t("allocated", { allocated });
    box.append(row(t("vramDevice", { device: s.device }), used));
    box.append(row(t("vramReserved"), fmtBytes(s.vram.reserved)));
    if (s.vram.device_used !== null) box.append(row(t("vramUsedAll"), fmtBytes(s.vram.device_used)));
    box.append(sparkline(state.history.map((h) => h.vram || 0), s.vram.total));
  } else {
    box.append(row(t("vram"), t("noAccelerator", { device: s.device || "cpu" })));
  }
  if (s.ram) {
    box.append(row(t("ramAnon"), fmtBytes(s.ram.rss_anon)));
    box.append(row(t("ramFile"), fmtBytes(s.ram.rss_file)));
    box.append(row(t("ramShared"), fmtBytes(s.ram.rss_shmem)));
    box.append(row(t("ramAvailable"), fmtBytes(s.ram.system_available)));
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
    row(t("levelTier"), `${o.level} / ${o.tier}`),
    row(t("groups"), t("groupsValue", { groups: o.groups, resident: o.resident_groups })),
    row(t("prefetch"), String(o.prefetch_depth)),
  );
  // Where each group is now (ferry_pictures.js), from the pushed stats.
  if (o.group_states) card.append(groupStrip(o.group_states, t));
  for (const [tier, bytes] of Object.entries(o.tiers || {})) card.append(row(t("weightsOn", { tier }), fmtBytes(bytes)));
  card.append(
    row(t("bytesMoved"), fmtBytes(o.bytes_moved)),
    row(t("hostToDevice"), fmtRate(o.h2d_gbps)),
    row(t("diskRead"), fmtRate(o.disk_gbps)),
    row(t("stall"), `${Number(o.stall_s || 0).toFixed(3)} s`),
    row(t("transfer"), `${Number(o.transfer_s || 0).toFixed(3)} s`),
    row(t("forwards"), String(o.forwards)),
  );
  if (o.disk_read_last_prompt) card.append(row(t("diskReadPrompt"), fmtBytes(o.disk_read_last_prompt)));
  if (o.why) card.append(el("div", { class: "ferry-why" }, o.why));
  return card;
}

function render() {
  const root = state.root;
  if (!root) return;
  const s = state.last;
  const age = s ? ((Date.now() - state.lastAt) / 1000).toFixed(0) : "–";
  const panelBtn = el("button", { class: "ferry-btn", onclick: openPanel }, t("openPanel"));
  const children = [
    el("div", { class: "ferry-head" }, el("b", {}, t("title")), el("span", { class: "ferry-age" }, s ? t("updated", { age }) : t("waiting"))),
    panelBtn,
  ];
  if (state.status) children.push(el("div", { class: "ferry-status" }, state.status));
  if (s) {
    children.push(renderMemory(s));
    const models = el("div", { class: "ferry-section" }, el("h4", {}, t("offloaded", { count: s.offloads.length })));
    if (!s.offloads.length) models.append(el("div", { class: "ferry-muted" }, t("noneLive")));
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
    state.status = t("statsUnavailable", { error: e });
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
  state.status = t("panelStarting");
  render();
  const port = Number(app.extensionManager?.setting?.get?.(SETTING_PORT) ?? 0);
  const body = port > 0 ? { port } : {};
  try {
    const r = await api.fetchApi("/ferry/panel", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    const data = await r.json();
    if (r.ok && data.url) {
      state.status = t("panelStatus", { message: data.url });
      window.open(data.url, "_blank");
    } else {
      state.status = t("panelStatus", { message: data.error || r.statusText });
    }
  } catch (e) {
    state.status = t("panelStatus", { message: e });
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
      name: settingText(SETTING_POLL, "name"),
      type: "number",
      defaultValue: 2,
      attrs: { min: 0.5, max: 60, step: 0.5 },
      tooltip: settingText(SETTING_POLL, "tooltip"),
    },
    {
      id: SETTING_PORT,
      name: settingText(SETTING_PORT, "name"),
      type: "number",
      defaultValue: 0,
      attrs: { min: 0, max: 65535, step: 1 },
      tooltip: settingText(SETTING_PORT, "tooltip"),
    },
  ],
  setup() {
    document.head.append(el("style", { id: "ferry-style" }, STYLE));
    api.addEventListener("ferry.stats", (e) => accept(e.detail));
    app.extensionManager.registerSidebarTab({
      id: "ferry",
      icon: "pi pi-server",
      title: t("title"),
      tooltip: t("tooltip"),
      type: "custom",
      render(container) {
        state.root = el("div", { class: "ferry-tab", id: "ferry-sidebar" });
        // The plan section sits above the live part, in one scrolling column: render()
        // redraws only state.root, so a budget being typed keeps its focus.
        const column = el("div", { style: { height: "100%", overflowY: "auto" } }, planSection(t), state.root);
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
