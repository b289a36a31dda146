"""The sidebar's "Use Ferry's loader" (web/comfyui/ferry_swap.js) on ComfyUI's own frontend, in
Debian's chromium: a workflow UNETLoader -> Ferry Offload Model (and DualCLIPLoader -> Ferry
Offload Text Encoder) is planned, the button swaps the loader for Ferry's on the canvas (same id
and place, its values and every link kept), the swapped graph runs through the frontend's own
queueing to the output plain ComfyUI makes (``torch.equal``), one Ctrl+Z brings core's loader
back, and a value Ferry's node has no equivalent for (fp8_e4m3fn_fast) gets no button but the
plan's reason. The button is offered where core's loader holds the network in RAM: v0.3.64 and
v0.8 copy the file; v0.33 leaves the weights in the file's mapping, so there the diffusion
model is swapped with fp8 weights (which core converts in RAM) and the text encoders get the
reason instead. The mapping table (nodes/planning/loader_swap.py) is checked against this
server's /object_info.

    FERRY_COMFYUI=/work/comfy/v0.33.0 [FERRY_SCREENSHOTS=docs/img] \\
        pytest tests/comfyui/test_comfyui_swap.py -p no:cacheprovider

FERRY_SCREENSHOTS keeps comfyui-use-ferry-loader.png there: the plan's offer above the
swapped node.
"""

from __future__ import annotations

import importlib
import io
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import (
    Server,
    comfy_checkout,
    core_has,
    make_base,
    run_maker,
    start_server,
    stop_server,
)
from ferry_workflows import MODEL_FILE, Client, error_message, ferry, graph, saved_latent_name
from frontend_page import CHROMIUM, FLAGS, open_frontend, queue_with, set_setting
from safetensors.torch import load_file
from test_comfyui_text_encoder import CLIP_L, T5, clip_graph, ferry_te

from tests.conftest import PACK_NAME, load_pack

pytestmark = pytest.mark.browser
SHOTS = os.environ.get("FERRY_SCREENSHOTS")
load_pack()
swap_table = importlib.import_module(f"{PACK_NAME}.nodes.planning.loader_swap")

#: The workflows' node ids (ferry_workflows.graph, clip_graph): the loader, Ferry's node after it.
LOADER, OFFLOAD = "1", "10"
FLUX_PAIR = {"clip_name1": CLIP_L, "clip_name2": T5, "type": "flux"}
#: Whether this core copies a model file into RAM as it loads it (v0.3.64, v0.8); a newer one
#: leaves the weights in the file's mapping (comfy.utils.load_safetensors), so core's loader
#: holds a network in RAM only where it converts it: there the swap is tried with fp8 weights.
COPIES = not core_has("comfy/utils.py", "def load_safetensors")
UNET = (
    "UNETLoader",
    {"unet_name": MODEL_FILE, "weight_dtype": "default" if COPIES else "fp8_e4m3fn"},
)

GRAPH_JS = """(id) => {
  const app = window.comfyAPI.app.app;
  const links = [];
  for (const n of app.graph.nodes)
    for (const [slot, input] of (n.inputs || []).entries()) {
      if (input.link == null) continue;
      const l = app.graph.links.get ? app.graph.links.get(input.link) : app.graph.links[input.link];
      links.push([String(l.origin_id), l.origin_slot, String(n.id), slot, input.name]);
    }
  const n = app.graph.getNodeById(Number(id));
  return {
    type: n && n.type, pos: n && [...n.pos], count: app.graph.nodes.length,
    widgets: n ? Object.fromEntries((n.widgets || []).map((w) => [w.name, w.value])) : {},
    links: links.sort(),
    saved: (app.extensionManager.workflow.activeWorkflow.changeTracker.activeState.nodes || [])
      .filter((s) => String(s.id) === String(id)).map((s) => s.type),
  };
}"""


@pytest.fixture(scope="module")
def frontend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    comfy, py = comfy_checkout()
    base = tmp_path_factory.mktemp("swap-base")
    make_base(base, py, comfy)
    run_maker(base, py, comfy, "make_text_encoders.py")
    srv = start_server(comfy, py, base)
    for key, value in (
        ("Comfy.TutorialCompleted", True),
        ("Comfy.Locale", "en"),
        ("Comfy.Minimap.Visible", False),  # not over the screenshot's nodes
    ):
        set_setting(srv.url, key, value)
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture(scope="module")
def page(frontend: Server) -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            pg = browser.new_page(viewport={"width": 1400, "height": 860})
            pg.set_default_timeout(60_000)
            open_frontend(pg, frontend.url)
            yield pg
        finally:
            browser.close()


LOAD_JS = """async ([g, name]) => {
  await window.comfyAPI.app.app.loadApiJson(g, name); // a promise in newer frontends
}"""
#: Whether node ``id`` is of ``type`` (after an undo or a redo reloads the graph).
IS_JS = "([id, type]) => window.comfyAPI.app.app.graph.getNodeById(Number(id))?.type === type"


def _plan(page: Any, g: dict[str, Any], name: str) -> None:
    """Shows ``g`` on the canvas, opens Ferry's tab and presses Plan."""
    page.evaluate(LOAD_JS, [g, name])
    page.wait_for_timeout(500)
    if not page.locator("#ferry-plan-btn").is_visible():
        page.click(".ferry-tab-button")
    with page.expect_response(lambda r: r.url.endswith("/ferry/plan")):
        page.click("#ferry-plan-btn")
    # This plan drawn, not the last one: its "planning…" line is gone.
    page.wait_for_function(
        "() => !document.querySelector('#ferry-plan-result').innerText.includes('planning')"
    )
    page.wait_for_selector("#ferry-plan-result .ferry-card")


#: Fits the graph into the canvas right of the open sidebar (FitView would put it under it).
FIT_JS = """() => {
  const app = window.comfyAPI.app.app;
  const title = window.LiteGraph.NODE_TITLE_HEIGHT;
  const left = document.querySelector("#ferry-plan").getBoundingClientRect().right + 30;
  const r = app.canvas.canvas.getBoundingClientRect();
  const xs = [], ys = [];
  for (const n of app.graph.nodes) {
    xs.push(n.pos[0], n.pos[0] + n.size[0]);
    ys.push(n.pos[1] - title, n.pos[1] + n.size[1]);
  }
  const [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  const scale = Math.min((r.width - left - 30) / (x1 - x0), (r.height - 160) / (y1 - y0), 1.2);
  app.canvas.ds.scale = scale;
  app.canvas.ds.offset[0] = (left - r.left) / scale - x0;
  app.canvas.ds.offset[1] = 110 / scale - y0;
  app.canvas.setDirty(true, true);
}"""


def _canvas_shot(page: Any) -> Any:
    from PIL import Image

    page.evaluate(FIT_JS)
    page.wait_for_timeout(800)
    return Image.open(io.BytesIO(page.screenshot())).convert("RGB")


def test_the_mapping_matches_this_servers_nodes(frontend: Server) -> None:
    info = Client(frontend.url).get("/object_info")
    checked = 0
    for core, swap in swap_table.SWAPS.items():
        core_widgets = swap_table.registered_widgets(info[core]["input"])
        assert set(swap.widgets.values()) <= set(core_widgets), core
        assert [info[core]["output"][i] for i in swap.outputs] != [], core
        if swap.ferry not in info:  # Ferry Load Checkpoint, where this checkout lacks it
            continue
        ferry_widgets = swap_table.registered_widgets(info[swap.ferry]["input"])
        assert set(swap.widgets) | set(swap.fixed) <= set(ferry_widgets), core
        assert [info[core]["output"][i] for i in swap.outputs] == info[swap.ferry]["output"]

        def accepts(
            cls: str, known: dict[str, Any] = ferry_widgets, ferry: str = swap.ferry
        ) -> Any:
            return known if cls == ferry else None

        for ferry_w, core_w in swap.widgets.items():
            for value in core_widgets[core_w] or ():
                node = {"class_type": core, "inputs": {core_w: value}}
                entry = swap_table.ferry_loader("1", node, ["Ferry Offload Model"], accepts)
                offered = entry["ferry_class"] == swap.ferry
                allowed = ferry_widgets[ferry_w]
                assert offered == (allowed is None or value in allowed), (core, core_w, value)
                checked += 1
    assert checked > 10, checked


#: case -> (the workflow with core's loader, given its output prefix; Ferry's loader; the
#: values Ferry's loader shows after the swap; Ferry's node after it, its input).
CASES: dict[str, tuple[Callable[[str], dict[str, Any]], str, dict[str, Any], str]] = {
    "UNETLoader": (
        lambda prefix: graph([ferry(tier="disk")], prefix, seed=5, loader=UNET),
        "FerryLoadDiffusionModelQuantized",
        {
            "unet_name": MODEL_FILE,
            "quant_preset": "none",
            "weight_dtype": UNET[1]["weight_dtype"],
            "cache": True,
        },
        "Ferry Offload Model",
    ),
    "DualCLIPLoader": (
        lambda prefix: clip_graph("DualCLIPLoader", FLUX_PAIR, prefix, ferry_te(tier="disk")),
        "FerryLoadTextEncoderDual",
        {**FLUX_PAIR, "device": "default"},
        "Ferry Offload Text Encoder",
    ),
}


def _output(srv: Server, entry: dict[str, Any], prefix: str) -> dict[str, torch.Tensor]:
    """What the run saved: the latent, or the conditioning (FerryTestSaveConditioning's file)."""
    assert entry["status"]["status_str"] == "success", f"{error_message(entry)}\n{srv.log_tail()}"
    if any("latents" in out for out in entry["outputs"].values()):
        return load_file(str(srv.base / "output" / saved_latent_name(entry)))
    return load_file(str(srv.base / "output" / f"{prefix}.safetensors"))


@pytest.mark.parametrize("core", sorted(CASES))
def test_use_ferrys_loader_swaps_runs_and_undoes(frontend: Server, page: Any, core: str) -> None:
    make, ferry_class, values, offload = CASES[core]
    if core == "DualCLIPLoader" and not COPIES:
        pytest.skip("this core leaves the encoders in their files: no button (test below)")
    client = Client(frontend.url)
    reference = _output(frontend, client.run(make(f"{core}-plain"), timeout=600), f"{core}-plain")
    _plan(page, make(f"{core}-swap"), f"swap-{core}")
    button = page.locator(f"[data-ferry-swap='{LOADER}']")
    button.wait_for()
    assert page.locator("[data-ferry-swap]").count() == 1  # once per loader node
    card = page.inner_text("#ferry-plan-result")
    assert f"{core} holds the whole network in RAM before {offload} runs" in card, card
    before = page.evaluate(GRAPH_JS, LOADER)
    assert before["type"] == core, before
    offer = _canvas_shot(page)

    button.click()
    page.wait_for_selector("#ferry-plan-result .ferry-status")
    status = page.inner_text("#ferry-plan-result .ferry-status")
    after = page.evaluate(GRAPH_JS, LOADER)
    assert after["type"] == ferry_class, (status, after)
    assert f"node {LOADER} is now" in status, status
    assert after["pos"] == before["pos"] and after["count"] == before["count"]
    assert after["widgets"] == values
    assert after["links"] == before["links"]  # every link, to the same slots
    assert after["links"] and all(lk[0] != LOADER or lk[2] == OFFLOAD for lk in after["links"])
    assert after["saved"] == [ferry_class]  # the workflow's state, as it is saved
    assert page.locator("[data-ferry-swap]").count() == 0
    swapped = _canvas_shot(page)

    # One Ctrl+Z, as a user presses it (outside a text field), restores core's loader (right
    # after the swap: a run may change the graph itself, e.g. a randomized seed, which a Ctrl+Z
    # would undo first); then the plan's button swaps it again, for the run.
    page.evaluate("() => document.activeElement?.blur()")
    page.keyboard.press("Control+z")
    page.wait_for_function(IS_JS, arg=[LOADER, core], timeout=10_000)
    undone = page.evaluate(GRAPH_JS, LOADER)
    assert undone["links"] == before["links"] and undone["widgets"] == before["widgets"]
    with page.expect_response(lambda r: r.url.endswith("/ferry/plan")):
        page.click("#ferry-plan-btn")
    page.locator(f"[data-ferry-swap='{LOADER}']").click()
    page.wait_for_function(IS_JS, arg=[LOADER, ferry_class], timeout=10_000)
    redone = page.evaluate(GRAPH_JS, LOADER)
    assert redone["links"] == before["links"] and redone["widgets"] == values

    # The swapped graph, queued as the Run button queues it: the same output as plain core's.
    entry = client.wait(queue_with(page, {}), timeout=600)
    got = _output(frontend, entry, f"{core}-swap")
    assert sorted(got) == sorted(reference)
    assert all(torch.equal(got[k], reference[k]) for k in reference)
    assert entry["prompt"][2][LOADER]["class_type"] == ferry_class
    if SHOTS and core == "UNETLoader":
        _side_by_side(offer, swapped, Path(SHOTS) / "comfyui-use-ferry-loader.png")


def test_a_value_ferry_has_no_equivalent_for_gets_the_reason_not_the_button(page: Any) -> None:
    loader = ("UNETLoader", {"unet_name": MODEL_FILE, "weight_dtype": "fp8_e4m3fn_fast"})
    _plan(page, graph([ferry(tier="disk")], "fast", loader=loader), "swap-fast")
    row = page.locator(f"[data-ferry-noswap='{LOADER}']")
    row.wait_for()
    assert page.locator("[data-ferry-swap]").count() == 0
    assert "UNETLoader's weight_dtype 'fp8_e4m3fn_fast' has no equivalent" in row.inner_text()


@pytest.mark.skipif(COPIES, reason="this core copies the files into RAM: the button is offered")
def test_no_button_where_core_leaves_the_weights_in_the_files_mapping(page: Any) -> None:
    _plan(page, CASES["DualCLIPLoader"][0]("mapped"), "swap-mapped")
    row = page.locator(f"[data-ferry-noswap='{LOADER}']")
    row.wait_for()
    assert page.locator("[data-ferry-swap]").count() == 0
    assert "DualCLIPLoader leaves the weights in the file's mapping" in row.inner_text()


def _side_by_side(left: Any, right: Any, path: Path) -> None:
    from PIL import Image

    w, h = left.size  # the offer above, the swapped node below, at the browser's resolution
    both = Image.new("RGB", (w, 2 * h + 8), (40, 40, 40))
    both.paste(left, (0, 0))
    both.paste(right, (0, h + 8))
    path.parent.mkdir(parents=True, exist_ok=True)
    both.quantize(colors=256).save(path, optimize=True)  # a UI's few colours: a third the bytes
