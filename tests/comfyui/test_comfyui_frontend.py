"""Ferry as a user meets it in ComfyUI's own frontend (the core's comfyui-frontend-package), in
Debian's chromium: the Templates browser lists Ferry's templates with their thumbnails, each
template loads with no missing node and no red input (the frontend's own checks), every node's
help page opens in each shipped language (en, zh, ja, ko), the sidebar and its settings follow
the user's language, and the templates whose models the makers here can build run to a saved
image; during a run the Ferry sidebar tab shows the diffusion model's and the text encoder's
lines.

The templates name real model files (flux1-dev.safetensors, t5xxl_fp16.safetensors, …). The
base directory holds a stand-in under each of those names (make_template_models.py: the
frontend checks names only), and a run puts the tiny test models' names in their place, with a
64 x 64 latent and 2 steps (frontend_page.TINY): a tiny SD3 (MMDiT) for FLUX.1 [dev] (it takes
Flux's conditioning: the tiny T5's context and the tiny CLIP-L's pooled vector), tiny CLIP-L and
T5 encoders, a 16-channel VAE. Templates 02 (GGUF: ComfyUI-GGUF, linked when FERRY_COMFYUI_GGUF
is set) and 04 (Wan 2.2's 14B experts and UMT5-XXL) are loaded and checked, not run.

    FERRY_COMFYUI=/work/comfy/v0.33.0 [FERRY_COMFYUI_GGUF=/work/comfy/ComfyUI-GGUF] \\
    [FERRY_SCREENSHOTS=docs/img] [FERRY_TEMPLATE_THUMBNAILS=1] \\
        pytest tests/comfyui/test_comfyui_frontend.py

FERRY_SCREENSHOTS keeps comfyui-templates.png, comfyui-help-en.png, comfyui-help-zh.png and
comfyui-sidebar.png there; FERRY_TEMPLATE_THUMBNAILS=1 writes each template's thumbnail
(example_workflows/<name>.jpg) from its graph on the canvas. Chinese text needs a CJK font in
the system (Debian: fonts-noto-cjk), or chromium draws boxes.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, Server, comfy_checkout, make_base, run_maker, start_server, stop_server
from ferry_workflows import Client, error_message
from frontend_page import (
    CHROMIUM,
    FLAGS,
    TINY,
    close_dialogs,
    load_template,
    open_frontend,
    queue_with,
    set_setting,
    thumbnail,
)

from tests import locales
from tests.node_schemas import node_schemas, widgets
from tests.template_graph import template_paths

pytestmark = pytest.mark.browser
GGUF_PACK = os.environ.get("FERRY_COMFYUI_GGUF")
SHOTS = os.environ.get("FERRY_SCREENSHOTS")
THUMBNAILS = os.environ.get("FERRY_TEMPLATE_THUMBNAILS") == "1"
TEMPLATES = [p.stem for p in template_paths()]
#: Templates whose every model has a tiny stand-in here; 03 runs in the sidebar test.
RUNNABLE = ["01_model_bigger_than_gpu", "05_torch_compile", "06_memory_report"]
THIRD_PARTY = {"UnetLoaderGGUF"}


def shot(name: str) -> Path | None:
    return Path(SHOTS) / name if SHOTS else None


@pytest.fixture(scope="module")
def frontend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    comfy, py = comfy_checkout()
    base = tmp_path_factory.mktemp("frontend-base")
    make_base(base, py, comfy)
    run_maker(base, py, comfy, "make_text_encoders.py")
    run_maker(base, py, comfy, "make_template_models.py", *map(str, template_paths()))
    if GGUF_PACK:
        link = base / "custom_nodes" / "ComfyUI-GGUF"
        link.symlink_to(Path(GGUF_PACK).resolve(), target_is_directory=True)
    srv = start_server(comfy, py, base)
    for key, value in (
        ("Comfy.TutorialCompleted", True),  # no templates dialog over the canvas
        ("Comfy.Minimap.Visible", False),  # not over the thumbnails
        ("Comfy.Locale", "en"),
        ("LiteGraph.Canvas.MinFontSizeForLOD", 1),  # the thumbnails show the nodes' text
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
            pg = browser.new_page(viewport={"width": 1100, "height": 1000})
            pg.set_default_timeout(60_000)
            open_frontend(pg, frontend.url)
            yield pg
        finally:
            browser.close()


@pytest.mark.parametrize("name", TEMPLATES)
def test_each_template_loads_with_no_missing_node_and_no_red_input(page: Any, name: str) -> None:
    nodes = load_template(page, name)
    skip = set() if GGUF_PACK else THIRD_PARTY  # ComfyUI-GGUF's node, where it is not linked
    missing = [n["type"] for n in nodes if not n["registered"] and n["type"] not in skip]
    red = [n["type"] for n in nodes if n["errors"] and n["type"] not in skip]
    assert missing == [] and red == [], (missing, red)
    # The frontend's missing-nodes/models dialog: none, or (ComfyUI-GGUF not linked) one that
    # names only the third-party node. Closed either way, so the next test starts clean.
    dialog = page.locator(".p-dialog:visible")
    said = dialog.first.inner_text() if dialog.count() else ""
    close_dialogs(page)
    assert not said or any(t in said for t in skip & {n["type"] for n in nodes}), said
    schemas = node_schemas()
    for n in nodes:
        if n["type"] not in schemas:
            continue
        # The widgets the frontend built from the server's definition are the ones (and the
        # order) tests/test_templates.py checks the templates against.
        assert [w["name"] for w in n["widgets"]] == [w["name"] for w in widgets(schemas[n["type"]])]
        for w in n["widgets"]:
            if w["options"] is not None:
                assert w["value"] in w["options"], (n["type"], w)
            if isinstance(w["value"], (int, float)) and w["min"] is not None:
                assert w["min"] <= w["value"] <= w["max"], (n["type"], w)
    if THUMBNAILS:
        thumbnail(page, REPO / "example_workflows" / f"{name}.jpg")


def test_the_templates_browser_lists_them_with_thumbnails(page: Any) -> None:
    fetched: dict[str, int] = {}  # thumbnail name -> HTTP status, as the browser fetched them
    page.on(
        "response",
        lambda r: (
            fetched.update({r.url.rsplit("/", 1)[-1]: r.status})
            if "/workflow_templates/ComfyUI-Ferry/" in r.url and r.url.endswith(".jpg")
            else None
        ),
    )
    size = page.viewport_size
    page.set_viewport_size({"width": 1400, "height": 860})
    try:
        cmd = "() => window.comfyAPI.app.app.extensionManager.command.execute('Comfy.BrowseTemplates')"
        page.evaluate(cmd)
        page.get_by_text("ComfyUI-Ferry", exact=True).first.click()
        for name in TEMPLATES:
            heading = page.get_by_role("heading", name=name, exact=True)
            heading.scroll_into_view_if_needed()
            # The card's picture: our 512 px thumbnail, decoded.
            heading.evaluate(
                """async (h) => {
                  let card = h;
                  while (card && !card.querySelector("img")) card = card.parentElement;
                  const img = card.querySelector("img");
                  for (let i = 0; i < 100 && !(img.complete && img.naturalWidth); i++)
                    await new Promise((r) => setTimeout(r, 100));
                  if (img.naturalWidth !== 512) throw new Error(`thumbnail ${img.naturalWidth} px`);
                }"""
            )
        page.get_by_role("heading", name=TEMPLATES[0], exact=True).scroll_into_view_if_needed()
        page.wait_for_timeout(500)
        if (path := shot("comfyui-templates.png")) is not None:
            page.screenshot(path=str(path))
        page.keyboard.press("Escape")
    finally:
        page.set_viewport_size(size)
    assert fetched == {f"{n}.jpg": 200 for n in TEMPLATES}, fetched


def _open_help(page: Any, node: str, title: str, tooltip: str) -> None:
    page.evaluate(
        """(type) => {
          const app = window.comfyAPI.app.app;
          app.graph.clear();
          const n = window.LiteGraph.createNode(type);
          n.pos = [120, 160];
          app.graph.add(n);
          app.canvas.selectNode(n);
          app.canvas.setDirty(true, true);
        }""",
        node,
    )
    shown = "([a, b]) => document.body.innerText.includes(a) && document.body.innerText.includes(b)"
    try:
        page.wait_for_function(shown, arg=[title, tooltip], timeout=3_000)
    except Exception:  # the help panel is closed: the selection toolbox's info button opens it
        page.locator("button:has(i.icon-\\[lucide--info\\])").first.click()
        page.wait_for_function(shown, arg=[title, tooltip], timeout=30_000)


@pytest.mark.parametrize("lang", locales.LANGUAGES)
def test_every_node_help_page_opens(frontend: Server, page: Any, lang: str) -> None:
    set_setting(frontend.url, "Comfy.Locale", lang)
    try:
        open_frontend(page, frontend.url)
        defs = locales.read(lang, "nodeDefs.json")
        for node in sorted(node_schemas()):
            text = (REPO / "web" / "comfyui" / "docs" / node / f"{lang}.md").read_text()
            title = text.splitlines()[0].removeprefix("# ")
            first = next(iter(defs[node]["inputs"].values()))["tooltip"]
            _open_help(page, node, title, first)
            if node == "FerryOffloadModel" and (path := shot(f"comfyui-help-{lang}.png")):
                page.screenshot(path=str(path))
    finally:
        set_setting(frontend.url, "Comfy.Locale", "en")
        open_frontend(page, frontend.url)


def test_the_sidebar_and_its_settings_speak_the_users_language(frontend: Server, page: Any) -> None:
    # ferry.js's words (locales/zh/main.json through GET /i18n) and its settings' labels
    # (locales/zh/settings.json, which the frontend applies itself).
    zh = locales.read("zh", "main.json")["ferry"]["sidebar"]
    settings = locales.read("zh", "settings.json")
    set_setting(frontend.url, "Comfy.Locale", "zh")
    try:
        open_frontend(page, frontend.url)
        page.click(".ferry-tab-button")
        page.wait_for_selector("#ferry-sidebar .ferry-section")
        text = page.inner_text("#ferry-sidebar")
        for key in ("memory", "openPanel", "ramAnon", "ramAvailable"):
            assert zh[key] in text, (key, text)
        assert "Open Ferry panel" not in text
        page.click(".ferry-tab-button")  # closed again
        page.evaluate(
            "() => window.comfyAPI.app.app.extensionManager.command.execute("
            "'Comfy.ShowSettingsDialog')"
        )
        page.get_by_text("Ferry", exact=True).first.click()
        for entry in settings.values():
            page.get_by_text(entry["name"], exact=True).first.wait_for()
        page.keyboard.press("Escape")
    finally:
        set_setting(frontend.url, "Comfy.Locale", "en")
        open_frontend(page, frontend.url)


def test_a_template_runs_and_the_sidebar_shows_both_lines(frontend: Server, page: Any) -> None:
    # Template 03: Ferry's two loaders, the text encoder and the model both offloaded (disk).
    load_template(page, "03_whole_graph_bigger_than_ram")
    page.click(".ferry-tab-button")
    page.wait_for_selector("#ferry-sidebar .ferry-section")
    client = Client(frontend.url)
    # A longer run than TINY's, so the screenshot is taken while it samples.
    pid = queue_with(page, {**TINY, "steps": 120, "width": 128, "height": 128})
    page.wait_for_selector("#ferry-sidebar .ferry-card[data-ferry-kind='text_encoder']")
    page.wait_for_function(
        """() => {
          const m = document.querySelector("#ferry-sidebar .ferry-card[data-ferry-kind='model']");
          return m && /forwards\\s+([2-9]|\\d\\d)/.test(m.innerText);
        }""",
        timeout=300_000,
    )
    text = page.inner_text("#ferry-sidebar")
    running = pid not in client.get(f"/history/{pid}")
    if (path := shot("comfyui-sidebar.png")) is not None:
        page.screenshot(path=str(path))
    entry = client.wait(pid, timeout=900)
    assert entry["status"]["status_str"] == "success", error_message(entry)
    assert running, "the run ended before the sidebar showed both lines"
    assert re.search(r"model: \w+", text) and "text encoder: clip_l + t5xxl" in text, text
    assert text.count("block / disk") == 2, text
    assert _images(entry), entry["outputs"]


def _images(entry: dict[str, Any]) -> list[str]:
    return [i["filename"] for out in entry["outputs"].values() for i in out.get("images", [])]


@pytest.mark.parametrize("name", RUNNABLE)
def test_a_template_runs_to_a_saved_image(frontend: Server, page: Any, name: str) -> None:
    load_template(page, name)
    start = time.monotonic()
    entry = Client(frontend.url).wait(queue_with(page, TINY), timeout=900)
    assert entry["status"]["status_str"] == "success", error_message(entry)
    saved = _images(entry)
    assert saved and all((frontend.base / "output" / f).is_file() for f in saved), saved
    if name == "06_memory_report":
        (report,) = [o["text"][0] for o in entry["outputs"].values() if "text" in o]
        assert "Offloaded models: 1" in report and "ComfyUI accounting" in report, report
    print(f"{name}: {time.monotonic() - start:.1f} s")
