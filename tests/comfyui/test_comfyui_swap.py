"""The sidebar's "Use Ferry's loader" (web/comfyui/ferry_swap.js) on ComfyUI's own frontend, in
Debian's chromium: a workflow UNETLoader -> Ferry Offload Model is planned, the button swaps the
loader for Ferry Load Diffusion Model on the canvas (same id and place, its values and every
link kept), the swapped graph runs through the frontend's own queueing to the latent plain
ComfyUI makes (``torch.equal``), one Ctrl+Z brings the UNETLoader back, and a value Ferry's
node has no equivalent for (fp8_e4m3fn_fast) gets no button but the plan's reason. The
mapping table (nodes/planning/loader_swap.py) is checked against this server's /object_info.

    FERRY_COMFYUI=/work/comfy/v0.33.0 [FERRY_SCREENSHOTS=docs/img] \\
        pytest tests/comfyui/test_comfyui_swap.py -p no:cacheprovider

FERRY_SCREENSHOTS keeps comfyui-use-ferry-loader.png there: the plan's offer above the
swapped node.
"""

from __future__ import annotations

import importlib
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import Server, comfy_checkout, make_base, start_server, stop_server
from ferry_workflows import MODEL_FILE, Client, error_message, ferry, graph, saved_latent_name
from frontend_page import CHROMIUM, FLAGS, open_frontend, queue_with, set_setting
from safetensors.torch import load_file

from tests.conftest import PACK_NAME, load_pack

pytestmark = pytest.mark.browser
SHOTS = os.environ.get("FERRY_SCREENSHOTS")
load_pack()
swap_table = importlib.import_module(f"{PACK_NAME}.nodes.planning.loader_swap")

#: The workflow's node ids (ferry_workflows.graph): the loader, Ferry's node after it.
LOADER, OFFLOAD = "1", "10"

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


def _latent(srv: Server, entry: dict[str, Any]) -> torch.Tensor:
    assert entry["status"]["status_str"] == "success", f"{error_message(entry)}\n{srv.log_tail()}"
    return load_file(str(srv.base / "output" / saved_latent_name(entry)))["latent_tensor"]


def _plan(page: Any, g: dict[str, Any], name: str) -> None:
    """Shows ``g`` on the canvas, opens Ferry's tab and presses Plan."""
    page.evaluate("([g, name]) => window.comfyAPI.app.app.loadApiJson(g, name)", [g, name])
    page.wait_for_timeout(500)
    if not page.locator("#ferry-plan-btn").is_visible():
        page.click(".ferry-tab-button")
    page.evaluate("() => document.querySelector('#ferry-plan-result').replaceChildren()")
    page.click("#ferry-plan-btn")
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


def test_use_ferrys_loader_swaps_runs_and_undoes(frontend: Server, page: Any) -> None:
    client = Client(frontend.url)
    g = graph([ferry(tier="disk")], "swap", seed=5)
    reference = _latent(frontend, client.run(graph([ferry(tier="disk")], "plain", seed=5)))
    _plan(page, g, "swap-demo")
    button = page.locator(f"[data-ferry-swap='{LOADER}']")
    button.wait_for()
    assert page.locator("[data-ferry-swap]").count() == 1  # once per loader node
    card = page.inner_text("#ferry-plan-result")
    assert "UNETLoader reads the whole file into RAM before Ferry Offload Model runs" in card
    before = page.evaluate(GRAPH_JS, LOADER)
    assert before["type"] == "UNETLoader", before
    offer = _canvas_shot(page)

    button.click()
    page.wait_for_selector("#ferry-plan-result .ferry-status")
    status = page.inner_text("#ferry-plan-result .ferry-status")
    after = page.evaluate(GRAPH_JS, LOADER)
    assert after["type"] == "FerryLoadDiffusionModelQuantized", (status, after)
    assert f"node {LOADER} is now" in status, status
    assert after["pos"] == before["pos"] and after["count"] == before["count"]
    assert after["widgets"] == {
        "unet_name": MODEL_FILE, "quant_preset": "none", "weight_dtype": "default", "cache": True,
    }  # fmt: skip
    assert after["links"] == before["links"]  # every link, to the same slots
    assert [LOADER, 0, OFFLOAD, 0, "model"] in after["links"]
    assert after["saved"] == ["FerryLoadDiffusionModelQuantized"]  # the workflow's saved state
    assert page.locator("[data-ferry-swap]").count() == 0
    swapped = _canvas_shot(page)

    # The swapped graph, queued as the Run button queues it: the same latent as plain core's.
    entry = client.wait(queue_with(page, {}), timeout=600)
    assert torch.equal(_latent(frontend, entry), reference)
    prompt = entry["prompt"][2]
    assert prompt[LOADER]["class_type"] == "FerryLoadDiffusionModelQuantized"

    # One Ctrl+Z, as a user presses it (outside a text field), restores the UNETLoader.
    page.evaluate("() => document.activeElement?.blur()")
    page.keyboard.press("Control+z")
    page.wait_for_function(
        "(id) => window.comfyAPI.app.app.graph.getNodeById(Number(id))?.type === 'UNETLoader'",
        arg=LOADER,
        timeout=10_000,
    )
    undone = page.evaluate(GRAPH_JS, LOADER)
    assert undone["links"] == before["links"] and undone["widgets"] == before["widgets"]
    if SHOTS:
        _side_by_side(offer, swapped, Path(SHOTS) / "comfyui-use-ferry-loader.png")


def test_a_value_ferry_has_no_equivalent_for_gets_the_reason_not_the_button(page: Any) -> None:
    loader = ("UNETLoader", {"unet_name": MODEL_FILE, "weight_dtype": "fp8_e4m3fn_fast"})
    _plan(page, graph([ferry(tier="disk")], "fast", loader=loader), "swap-fast")
    row = page.locator(f"[data-ferry-noswap='{LOADER}']")
    row.wait_for()
    assert page.locator("[data-ferry-swap]").count() == 0
    assert "UNETLoader's weight_dtype 'fp8_e4m3fn_fast' has no equivalent" in row.inner_text()


def _side_by_side(left: Any, right: Any, path: Path) -> None:
    from PIL import Image

    w, h = left.size  # the offer above, the swapped node below, at the browser's resolution
    both = Image.new("RGB", (w, 2 * h + 8), (40, 40, 40))
    both.paste(left, (0, 0))
    both.paste(right, (0, h + 8))
    path.parent.mkdir(parents=True, exist_ok=True)
    both.quantize(colors=256).save(path, optimize=True)  # a UI's few colours: a third the bytes
