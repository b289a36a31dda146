// Ferry's two pictures in the sidebar, apart from the text around them:
// - the pre-flight's picture per network (ferry_plan.js draws it beside the network's sentence):
//   a bar each for VRAM, RAM and disk, the bytes the network waits in there (the plan's
//   "waits", offload_core/planner/picture.py) against the machine's room (the plan's "room"),
//   and its predicted time;
// - the live group strip per offload (ferry.js draws it in the offload's card): one cell per
//   group, coloured by where it is now (the pushed stats' "group_states", one letter a group:
//   offload_core/runtime/group_states.py).
// Plain DOM and CSS. Words come through the sidebar's t() (locales/<lang>/main.json).
import { el, fmtBytes } from "./ferry_dom.js";

const STYLE = `
.ferry-picture { margin: 4px 0 2px; }
.ferry-bar-row { display: grid; grid-template-columns: 38px 1fr; gap: 6px; align-items: center; margin: 2px 0; }
.ferry-bar-name { font-size: 11px; opacity: 0.8; }
.ferry-bar { position: relative; height: 16px; border-radius: 3px; background: rgba(128,128,128,0.22); overflow: hidden; }
.ferry-bar-fill { position: absolute; left: 0; top: 0; bottom: 0; border-radius: 3px; opacity: 0.7; }
.ferry-bar-fill.vram { background: #3fae6a; }
.ferry-bar-fill.ram { background: #4e8fe0; }
.ferry-bar-fill.disk { background: #d99a2b; }
.ferry-bar-fill.over { background: #d9534f; }
.ferry-bar-text { position: relative; font-size: 10px; line-height: 16px; padding-left: 4px; white-space: nowrap; }
.ferry-picture-time { font-size: 11px; opacity: 0.85; margin-top: 2px; }
.ferry-strip { display: flex; flex-wrap: wrap; gap: 2px; margin: 4px 0 2px; }
.ferry-cell { width: 9px; height: 14px; border-radius: 2px; }
.ferry-cell.d { background: #3fae6a; }
.ferry-cell.f { background: #e0b030; }
.ferry-cell.w { background: rgba(128,128,128,0.35); }
.ferry-cell.r { background: #2a6e45; }
.ferry-strip-legend { font-size: 10px; opacity: 0.85; display: flex; flex-wrap: wrap; gap: 8px; }
.ferry-strip-legend .ferry-cell { display: inline-block; width: 8px; height: 8px; margin-right: 3px; }
`;

function ensureStyle() {
  if (!document.getElementById("ferry-pictures-style")) {
    document.head.append(el("style", { id: "ferry-pictures-style" }, STYLE));
  }
}

// One bar: `bytes` against `room` (null: no room known, the bar is drawn full-width grey
// behind the figure). More than the room shows red and full.
function bar(kind, name, bytes, room, text) {
  const share = room ? Math.min(1, bytes / room) : 0;
  const over = room !== null && room !== undefined && bytes > room;
  // A share too small to see still gets a sliver: "some bytes wait here" is the point.
  const width = over ? "100%" : bytes > 0 && room ? `${share * 100}%` : "0";
  const minWidth = bytes > 0 && room ? "2px" : "0";
  const style = { width, minWidth };
  const fill = el("div", { class: `ferry-bar-fill ${kind}${over ? " over" : ""}`, style });
  return el(
    "div",
    { class: "ferry-bar-row", "data-ferry-bar": kind, "data-ferry-share": share.toFixed(4) },
    el("span", { class: "ferry-bar-name" }, name),
    el("div", { class: "ferry-bar" }, fill, el("span", { class: "ferry-bar-text" }, text)),
  );
}

function seconds(v) {
  return Number(v || 0).toFixed(1);
}

// The pre-flight's picture of one network of the plan (`n`: one of its "networks", `room`:
// its "room"), drawn from the figures alone.
export function planPicture(n, room, t) {
  ensureStyle();
  const w = n.waits || {};
  room = room || {};
  const box = el("div", { class: "ferry-picture", "data-ferry-picture": n.name });
  if (w.vram === null || w.vram === undefined) {
    box.append(bar("vram", t("pictureVramName"), 0, null, t("pictureNoGpu")));
  } else {
    box.append(bar("vram", t("pictureVramName"), w.vram, room.vram, t("pictureVram", { bytes: fmtBytes(w.vram), room: fmtBytes(room.vram) })));
  }
  box.append(bar("ram", t("pictureRamName"), w.ram || 0, room.ram, t("pictureRam", { bytes: fmtBytes(w.ram || 0), room: fmtBytes(room.ram) })));
  const disk = w.disk || 0;
  const diskText = room.disk === null || room.disk === undefined
    ? t("pictureDiskNoRoom", { bytes: fmtBytes(disk) })
    : t("pictureDisk", { bytes: fmtBytes(disk), room: fmtBytes(room.disk) });
  box.append(bar("disk", t("pictureDiskName"), disk, room.disk, diskText));
  if (n.prompt_seconds !== undefined) {
    const time = t("pictureTime", { prompt: seconds(n.prompt_seconds), load: seconds(n.load_seconds), read: Number(n.read_seconds || 0).toFixed(2) });
    const bound = n.transfer_bound ? ` (${t("pictureTransferBound")})` : "";
    box.append(el("div", { class: "ferry-picture-time", "data-ferry-picture-time": "" }, time + bound));
  }
  return box;
}

// The live strip of one offload: a cell per group, in the plan's order, and a legend that
// counts each state.
export function groupStrip(states, t) {
  ensureStyle();
  const letters = String(states || "");
  const cells = [...letters].map((c) => el("span", { class: `ferry-cell ${c}` }));
  const count = (letter) => [...letters].filter((c) => c === letter).length;
  // The legend, in this order; no resident groups: nothing to say of them.
  const said = [
    ["d", t("stripOnDevice", { count: count("d") })],
    ["f", t("stripInFlight", { count: count("f") })],
    ["w", t("stripWaiting", { count: count("w") })],
  ];
  if (count("r")) said.push(["r", t("stripResident", { count: count("r") })]);
  const legend = el("div", { class: "ferry-strip-legend" });
  for (const [letter, words] of said) legend.append(el("span", {}, el("span", { class: `ferry-cell ${letter}` }), words));
  return el("div", { class: "ferry-strip-box", "data-ferry-strip": letters }, el("div", { class: "ferry-strip" }, ...cells), legend);
}
