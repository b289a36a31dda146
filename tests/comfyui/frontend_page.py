"""Driving ComfyUI's own frontend (the comfyui-frontend-package the core serves) in Debian's
chromium: open it, load a template the way the Templates browser does, put the tiny test
models' names in, queue it through the frontend's own graph-to-prompt, open a node's help.

Only what the frontend exposes to extensions is used (``window.comfyAPI.app.app``, its
``extensionManager.command``, ``window.comfyAPI.api.api``), plus what a user clicks."""

from __future__ import annotations

import io
import json
import urllib.request
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
# Flags that let chromium start on a headless CI machine (no GPU, no sandbox user namespace,
# no network of its own).
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]  # fmt: skip
PACK = "ComfyUI-Ferry"  # the folder name conftest.make_base links this repository under

#: What a run puts in place of the templates' real model files (tests/comfyui makers' files),
#: and a smaller latent and fewer steps: the templates are run as shipped otherwise.
TINY = {
    "unet_name": "ferry-template-mmdit.safetensors",
    "clip_name1": "ferry-tiny-clip-l.safetensors",
    "clip_name2": "ferry-tiny-t5xxl.safetensors",
    "vae_name": "ferry-tiny-flux-vae.safetensors",
    "width": 64,
    "height": 64,
    "steps": 2,
}

LOAD_JS = """async ([pack, name]) => {
  const app = window.comfyAPI.app.app;
  const wf = await (await fetch(`/api/workflow_templates/${pack}/${name}.json`)).json();
  await app.loadGraphData(wf, true, true, name);
  const types = window.LiteGraph.registered_node_types;
  return app.graph.nodes.map((n) => ({
    type: n.type, registered: n.type in types, errors: !!n.has_errors,
    widgets: (n.widgets || []).map((w) => ({
      name: w.name, value: w.value, options: w.options?.values ?? null,
      min: w.options?.min ?? null, max: w.options?.max ?? null })),
  }));
}"""

QUEUE_JS = """async (values) => {
  const app = window.comfyAPI.app.app;
  for (const n of app.graph.nodes)
    for (const w of n.widgets || []) if (w.name in values) w.value = values[w.name];
  const prompt = await app.graphToPrompt();
  return await window.comfyAPI.api.api.queuePrompt(0, prompt);
}"""


def set_setting(url: str, key: str, value: Any) -> None:
    req = urllib.request.Request(
        f"{url}/api/settings/{key}", data=json.dumps(value).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=30):
        pass


def open_frontend(page: Any, url: str) -> None:
    """The frontend, with the dialogs a fresh user folder opens closed."""
    page.goto(url + "/", wait_until="networkidle", timeout=120_000)
    page.wait_for_function("() => window.comfyAPI?.app?.app?.graph", timeout=60_000)
    close_dialogs(page)


def close_dialogs(page: Any) -> None:
    for _ in range(10):
        if not page.locator(".p-dialog-mask").count():
            return
        page.keyboard.press("Escape")
        page.wait_for_timeout(300)


#: The app is set up: its extensions' sidebar tabs are there and its first workflow (the
#: default one, or the last one open) is on the canvas.
SET_UP = """() => !!document.querySelector(".ferry-tab-button") &&
  (window.comfyAPI.app.app.graph.nodes ?? window.comfyAPI.app.app.graph._nodes).length > 0"""
#: The canvas holds exactly the loaded workflow: ``count`` nodes, each built as its type (a
#: node the frontend could not build has no comfyClass), every input of a ``type`` node
#: linked (a widget's socket aside).
SHOWS = """([type, count]) => {
  const g = window.comfyAPI.app.app.graph;
  const nodes = g.nodes ?? g._nodes;
  const built = (n) => n.comfyClass ?? n.constructor?.comfyClass;
  return nodes.length === count && nodes.every((n) => built(n)) && nodes
    .filter((n) => built(n) === type)
    .every((n) => (n.inputs ?? []).every((i) => i.link != null || i.widget));
}"""


def load_api_workflow(page: Any, prompt: dict[str, Any], name: str, shows: str) -> None:
    """Loads ``prompt`` (API format) onto the canvas, as the frontend loads a dropped API
    workflow, once the app is set up, and waits until the canvas shows it whole (its
    ``shows`` node linked). v0.3.64's frontend (1.27.10) is still setting up when its graph
    first exists (at networkidle it has none): a workflow loaded then is replaced by the
    default one, so it is loaded again until it stays."""
    from playwright.sync_api import TimeoutError as NotYet

    try:
        page.wait_for_function(SET_UP, timeout=30_000)
    except NotYet:
        pass  # no first workflow shown: nothing will replace ours
    want = [shows, len(prompt)]
    for _ in range(6):
        page.evaluate("([g, name]) => window.comfyAPI.app.app.loadApiJson(g, name)", [prompt, name])
        try:
            page.wait_for_function(SHOWS, arg=want, timeout=5_000)
            page.wait_for_timeout(1_000)
            if page.evaluate(SHOWS, want):
                close_dialogs(page)  # a dialog the late setup opened over the canvas
                return
        except NotYet:  # replaced by the default workflow: load it again
            continue
    raise AssertionError(f"the frontend never kept the loaded workflow {name!r} on its canvas")


def load_template(page: Any, name: str) -> list[dict[str, Any]]:
    """Loads ``name`` from the URL the Templates browser loads it from; its nodes as the
    frontend built them (registered type, its own error flag, each widget)."""
    return page.evaluate(LOAD_JS, [PACK, name])  # type: ignore[no-any-return]


def queue_with(page: Any, values: dict[str, Any]) -> str:
    """Sets every widget named in ``values`` on the loaded graph and queues it through the
    frontend (graphToPrompt, as its Run button does); the prompt id."""
    body = page.evaluate(QUEUE_JS, values)
    assert not body.get("node_errors"), body
    return str(body["prompt_id"])


BOUNDS_JS = """() => {
  const app = window.comfyAPI.app.app;
  const title = window.LiteGraph.NODE_TITLE_HEIGHT;
  const xs = [], ys = [];
  for (const n of app.graph.nodes) {
    xs.push(n.pos[0], n.pos[0] + n.size[0]);
    ys.push(n.pos[1] - title, n.pos[1] + n.size[1]);
  }
  const a = app.canvas.ds.convertOffsetToCanvas([Math.min(...xs), Math.min(...ys)]);
  const b = app.canvas.ds.convertOffsetToCanvas([Math.max(...xs), Math.max(...ys)]);
  const r = app.canvas.canvas.getBoundingClientRect();
  return { x: r.left + a[0], y: r.top + a[1], width: b[0] - a[0], height: b[1] - a[1] };
}"""


def thumbnail(page: Any, path: Path, side: int = 512) -> None:
    """The loaded graph as the canvas draws it (fitted to a large window, every node's text
    drawn), padded square with the canvas's own background, as a ``side`` px JPEG."""
    from PIL import Image

    size = page.viewport_size
    page.set_viewport_size({"width": 2200, "height": 1600})
    try:
        page.evaluate(
            "() => window.comfyAPI.app.app.extensionManager.command.execute('Comfy.Canvas.FitView')"
        )
        page.wait_for_timeout(1000)
        box = page.evaluate(BOUNDS_JS)
        pad = 24
        clip = {"x": box["x"] - pad, "y": box["y"] - pad,
                "width": box["width"] + 2 * pad, "height": box["height"] + 2 * pad}  # fmt: skip
        png = page.screenshot(clip=clip)
    finally:
        page.set_viewport_size(size)
    img = Image.open(io.BytesIO(png)).convert("RGB")
    w, h = img.size
    square = Image.new("RGB", (max(w, h),) * 2, img.getpixel((2, 2)))
    square.paste(img, ((max(w, h) - w) // 2, (max(w, h) - h) // 2))
    path.parent.mkdir(parents=True, exist_ok=True)
    square.resize((side, side), Image.LANCZOS).save(path, "JPEG", quality=88, optimize=True)
