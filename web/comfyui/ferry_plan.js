// Ferry's pre-flight and budgets in the sidebar (ferry.js draws them): "Plan this workflow"
// sends the workflow as the frontend queues it to /ferry/plan, which reads only the files'
// headers, and lists each network the graph loads, where Ferry puts it and why, and the
// predicted peaks with "fits" or what to change. The budgets box sets Ferry's VRAM and RAM
// budgets (/ferry/budgets, kept in the settings file), used from the next prompt on.
// Kept apart from ferry.js so that file's own drawing stays as it is; its words are the
// sidebar's (locales/<lang>/main.json, ferry.sidebar), through the t() ferry.js hands it.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { el as node, fmtBytes as gib } from "./ferry_dom.js";
import { planPicture } from "./ferry_pictures.js";
import { swapRow } from "./ferry_swap.js";

const plan = { result: null, status: "" };
let t = (key) => key; // ferry.js's translator, set by planSection



async function postJson(path, body) {
  const r = await api.fetchApi(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  return [r.ok, await r.json()];
}

async function planWorkflow(redraw) {
  plan.status = t("planning");
  redraw();
  try {
    const queued = await app.graphToPrompt(); // { output: API-format prompt, workflow }
    const [ok, data] = await postJson("/ferry/plan", { prompt: queued.output });
    plan.result = ok ? data : null;
    plan.status = ok ? "" : t("planError", { error: data.error });
  } catch (e) {
    plan.status = t("planError", { error: e });
  }
  redraw();
}

async function saveBudgets(vram, ram, redraw) {
  const [ok, data] = await postJson("/ferry/budgets", { vram_gb: vram || null, ram_gb: ram || null });
  plan.status = ok ? t("budgetsSaved") : t("budgetsError", { error: data.error });
  redraw();
}

function budgetBox(redraw) {
  const vram = node("input", { id: "ferry-budget-vram", size: 5, placeholder: t("budgetNone") });
  const ram = node("input", { id: "ferry-budget-ram", size: 5, placeholder: t("budgetNone") });
  api.fetchApi("/ferry/budgets").then(async (r) => {
    const b = r.ok ? (await r.json()).budgets : {};
    vram.value = b.vram_gb ?? "";
    ram.value = b.ram_gb ?? "";
  });
  const save = node("button", { class: "ferry-btn", onclick: () => saveBudgets(vram.value, ram.value, redraw) }, t("saveBudgets"));
  return node("div", { class: "ferry-budgets" }, `${t("budgetVram")} `, vram, ` ${t("budgetRam")} `, ram, " ", save);
}

function networkCard(n, room, swapRows) {
  const file = (n.files || []).map((f) => f.split(/[\\/]/).pop()).join(" + ");
  const card = node(
    "div",
    { class: "ferry-card", "data-ferry-plan": n.name },
    node("div", { class: "ferry-name" }, `${n.title} → ${n.tier}`),
    node("div", { class: "ferry-muted" }, `${file}, ${gib(n.bytes)}${n.ferry_node ? "" : ` (${t("noFerryNode")})`}`),
    node("div", { class: "ferry-why" }, n.reason),
    planPicture(n, room, t), // its bars and time (ferry_pictures.js)
  );
  const row = swapRows(n.ferry_loader);
  if (row) card.append(row);
  return card;
}

// "Use Ferry's loader" (ferry_swap.js), once per core loader node: a swapped node's rows go,
// its message stays until the next plan.
function swapRows(redraw) {
  const shown = new Set();
  return (entry) => {
    if (!entry || shown.has(entry.node_id)) return null;
    shown.add(entry.node_id);
    return swapRow(entry, t, (message, swapped) => {
      plan.status = message;
      if (!swapped) return redraw();
      for (const n of plan.result?.networks || []) if (n.ferry_loader?.node_id === entry.node_id) n.ferry_loader = null;
      redraw();
    });
  };
}

function drawResult(out, redraw) {
  const children = [];
  if (plan.status) children.push(node("div", { class: "ferry-status" }, plan.status));
  const p = plan.result;
  if (p) {
    children.push(node("div", { class: p.fits ? "ferry-fits" : "ferry-status" }, p.verdict));
    const peaks = { vram: gib(p.peak_vram), ram: gib(p.peak_ram), disk: gib(p.disk_bytes) };
    const predicted = p.peak_vram === null ? t("predictedPeak", peaks) : t("predictedPeakVram", peaks);
    children.push(node("div", { class: "ferry-muted" }, predicted));
    // The planner's predicted time, said (in its own words) for what it is: transfer-bound
    // until a prompt measured compute.
    if (p.time) children.push(node("div", { class: "ferry-muted", "data-ferry-time": "" }, p.time));
    const rows = swapRows(redraw);
    for (const n of p.networks) children.push(networkCard(n, p.room, rows));
  }
  out.replaceChildren(...children);
}

// The sidebar's plan section, built once per sidebar (ferry.js redraws its own part every
// second; this part only on its own events, so a budget being typed keeps its focus).
export function planSection(translate) {
  t = translate;
  const out = node("div", { id: "ferry-plan-result" });
  const redraw = () => drawResult(out, redraw);
  const box = node("div", { class: "ferry-plan", id: "ferry-plan" }, node("h4", {}, t("plan")));
  box.append(node("button", { class: "ferry-btn", id: "ferry-plan-btn", onclick: () => planWorkflow(redraw) }, t("planThisWorkflow")));
  box.append(budgetBox(redraw), out);
  redraw();
  return box;
}
