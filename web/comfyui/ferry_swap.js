// "Use Ferry's loader": the sidebar's plan offers, per core loader whose network a Ferry node
// offloads (UNETLoader, CLIPLoader, DualCLIPLoader, CheckpointLoaderSimple), to replace it on
// the canvas with Ferry's equivalent. The server decides and sends the mapping (the plan's
// "ferry_loader" entry, nodes/planning/loader_swap.py): which Ferry widget takes which core
// widget's value, the values Ferry's node sets itself, which core output each Ferry output is.
// The swap goes through LiteGraph's own calls, as the frontend's node replacement does: the
// new node takes the old one's id and place, its values and every link; the whole swap is one
// change of the workflow's change tracker, so one Ctrl+Z restores the core loader, and the
// workflow saves it like any edit. Kept apart from ferry_plan.js, which only places the row.
import { app } from "../../scripts/app.js";
import { el } from "./ferry_dom.js";

function linkOf(graph, id) {
  // LiteGraph keeps links in a Map in newer frontends, in a plain object in older ones.
  return graph.links?.get ? graph.links.get(id) : graph.links?.[id];
}

function widgetOf(node, name) {
  return (node.widgets || []).find((w) => w.name === name);
}

// Every value the new node takes, checked against its widgets before the graph is touched.
function valuesFor(old, fresh, swap) {
  const values = [];
  const put = (name, value) => {
    const w = widgetOf(fresh, name);
    if (!w) throw new Error(`${swap.ferry_class} has no widget ${name}`);
    const choices = w.options?.values;
    if (Array.isArray(choices) && !choices.includes(value)) {
      throw new Error(`${swap.ferry_class}'s ${name} does not offer ${JSON.stringify(value)}`);
    }
    values.push([w, value]);
  };
  for (const [ferryName, coreName] of Object.entries(swap.widgets || {})) {
    const w = widgetOf(old, coreName);
    if (w) put(ferryName, w.value); // an optional widget the old node lacks keeps its default
  }
  for (const [name, value] of Object.entries(swap.fixed || {})) put(name, value);
  return values;
}

// The links into and out of ``old``, as the new node will take them.
function linksFor(graph, old, fresh, swap) {
  const ferryName = Object.fromEntries(Object.entries(swap.widgets || {}).map(([f, c]) => [c, f]));
  const into = [];
  for (const input of old.inputs || []) {
    if (input.link == null) continue;
    const link = linkOf(graph, input.link);
    const name = ferryName[input.name] ?? input.name;
    const slot = fresh.findInputSlot(name);
    if (!link || slot < 0) throw new Error(`${swap.ferry_class} has no input ${name} for the link into ${input.name}`);
    into.push({ origin: link.origin_id, originSlot: link.origin_slot, slot });
  }
  const out = [];
  (swap.outputs || []).forEach((coreSlot, slot) => {
    const from = old.outputs?.[coreSlot];
    if (from && fresh.outputs?.[slot]?.type !== from.type) {
      throw new Error(`${swap.ferry_class}'s output ${slot} is not a ${from.type}`);
    }
    for (const id of from?.links || []) {
      const link = linkOf(graph, id);
      if (link) out.push({ slot, target: link.target_id, targetSlot: link.target_slot });
    }
  });
  return { into, out };
}

// Replaces the plan's core loader node with Ferry's equivalent; the new node. Throws, with the
// graph untouched, where the node is gone or its values and links do not fit Ferry's node.
export function swapNode(graph, swap, LiteGraph = window.LiteGraph) {
  const old = graph.getNodeById(swap.node_id) ?? graph.getNodeById(Number(swap.node_id));
  if (!old || old.type !== swap.class_type) {
    throw new Error(`node ${swap.node_id} is no longer a ${swap.class_type}: plan again`);
  }
  const fresh = LiteGraph.createNode(swap.ferry_class);
  if (!fresh) throw new Error(`${swap.ferry_class} is not registered: update ComfyUI-Ferry`);
  const values = valuesFor(old, fresh, swap);
  const { into, out } = linksFor(graph, old, fresh, swap);
  const tracker = app.extensionManager?.workflow?.activeWorkflow?.changeTracker;
  tracker?.beforeChange?.();
  try {
    const { id, pos, mode } = old;
    graph.remove(old);
    fresh.id = id; // the workflow and the plan keep naming it by its id
    fresh.pos = [...pos];
    fresh.mode = mode; // a bypassed or muted loader stays so
    graph.add(fresh);
    for (const [w, value] of values) {
      w.value = value;
      w.callback?.(value);
    }
    for (const l of into) graph.getNodeById(l.origin)?.connect(l.originSlot, fresh, l.slot);
    for (const l of out) fresh.connect(l.slot, graph.getNodeById(l.target), l.targetSlot);
    graph.setDirtyCanvas?.(true, true);
  } finally {
    tracker?.afterChange?.(); // one undo step for the whole swap
  }
  return fresh;
}

// The plan card's row for a core loader (shown once per loader node): the button where the
// plan offers the swap, else why not. ``done(message, swapped)`` is told how the swap went.
export function swapRow(entry, t, done) {
  if (!entry) return null;
  if (!entry.ferry_class) return el("div", { class: "ferry-muted", "data-ferry-noswap": entry.node_id }, t("noSwap", { why: entry.why }));
  const button = el(
    "button",
    {
      class: "ferry-btn",
      "data-ferry-swap": entry.node_id,
      title: entry.why,
      onclick: () => {
        try {
          const node = swapNode(app.graph, entry);
          done(t("swapped", { id: node.id, node: node.title || entry.ferry_class }), true);
        } catch (e) {
          done(t("swapError", { error: e.message || e }), false);
        }
      },
    },
    t("useFerryLoader"),
  );
  return el("div", { class: "ferry-swap" }, button, el("div", { class: "ferry-muted" }, entry.why));
}
