"""The ComfyUI sidebar (web/comfyui/ferry.js) in a real browser (Debian's chromium driven by
playwright), without ComfyUI: the file is served as ComfyUI serves an extension, beside
stand-ins of the two frontend modules it imports (``app`` and ``api``, with the calls it
makes), and it is fed /ferry/stats payloads built by nodes/ui/stats.py from real offloads (a
diffusion model and a text encoder, tests/test_offload_lines.py's). Each offload is one card
whose title says what it is, with where its weights are, GB/s and stall. Its words come from
the pack's locales, served at /api/i18n as core serves them (tests/locales.py), in the
language of the Comfy.Locale setting. The real server and frontend:
tests/comfyui/test_comfyui_sidebar.py."""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests import locales
from tests.test_offload_lines import MODEL_NAME, TE_NAME, Graph, graph, monitor, stats

pytestmark = pytest.mark.browser
sync_api = pytest.importorskip("playwright.sync_api")

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("FERRY_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]  # fmt: skip
if not Path(CHROMIUM).exists():
    pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)

__all__ = ["graph"]  # the fixture, imported for the tests below

# What ferry.js imports from ComfyUI's frontend, and only that: registerExtension,
# extensionManager.registerSidebarTab / setting.get, api.addEventListener / fetchApi.
APP_JS = """
export const app = {
  extensions: [], tabs: [],
  registerExtension(ext) { app.extensions.push(ext); },
  extensionManager: {
    registerSidebarTab(tab) { app.tabs.push(tab); },
    setting: { get: (id) => (window.ferrySettings || {})[id] },
  },
  // The workflow as the frontend queues it (ferry_plan.js sends its output to /ferry/plan).
  graphToPrompt: async () => ({ output: { "1": { class_type: "UNETLoader", inputs: {} } } }),
};
"""
API_JS = """
const target = new EventTarget();
export const api = {
  addEventListener: (type, fn) => target.addEventListener(type, fn),
  fetchApi: (path, init) => fetch(path.replace(/^\\//, "/api/"), init),
  // ComfyUI's api dispatches a server event as a CustomEvent whose detail is its data.
  push: (type, data) => target.dispatchEvent(new CustomEvent(type, { detail: data })),
};
"""
PAGE = """<!doctype html><html><body><div id="host" style="width:340px"></div>
<script type="module">
import { app } from "/scripts/app.js";
import { api } from "/scripts/api.js";
await import("/extensions/ComfyUI-Ferry/ferry.js");
for (const ext of app.extensions) ext.setup?.();
app.tabs[0].render(document.getElementById("host"));
window.ferryTabTooltip = app.tabs[0].tooltip;
window.ferryApi = api;
</script></body></html>"""


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A folder laid out as ComfyUI serves it, on a local port; the test writes the stats
    GET /api/ferry/stats answers into the returned path."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "app.js").write_text(APP_JS)
    (tmp_path / "scripts" / "api.js").write_text(API_JS)
    ext = tmp_path / "extensions" / "ComfyUI-Ferry"
    ext.mkdir(parents=True)
    for js in (REPO / "web" / "comfyui").glob("*.js"):  # ferry.js and the modules it imports
        shutil.copy(js, ext / js.name)
    (tmp_path / "index.html").write_text(PAGE)
    (tmp_path / "api" / "ferry").mkdir(parents=True)
    (tmp_path / "api" / "i18n").write_text(json.dumps(locales.served()))
    handler = functools.partial(QuietHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", tmp_path / "api" / "ferry" / "stats"
    finally:
        server.shutdown()
        thread.join()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    extensions_map: ClassVar[dict[str, str]] = {
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".js": "text/javascript",
    }

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        """Answers a POST with the file at its path, as a GET would (the test writes the
        route's answer there), and keeps the body it was sent beside it (``.sent``)."""
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        Path(self.translate_path(self.path) + ".sent").write_bytes(body)
        self.do_GET()


def cards(page: Any) -> list[dict[str, str]]:
    return page.eval_on_selector_all(  # type: ignore[no-any-return]
        "#ferry-sidebar .ferry-card",
        "cs => cs.map(c => ({kind: c.dataset.ferryKind, title: c.querySelector('.ferry-name')"
        ".innerText, text: c.innerText}))",
    )


def test_the_sidebar_shows_a_labelled_card_per_offload(
    graph: Graph, site: tuple[str, Path]
) -> None:
    url, stats_file = site
    payload = stats.stats_payload(None, monitor.read_offloads(), None)
    stats_file.write_text(json.dumps(payload))
    model, te = payload["offloads"]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(30_000)
            page.goto(url + "/index.html")
            # The tab polls /ferry/stats when no push has come: two cards, model first.
            page.wait_for_function(
                "() => document.querySelectorAll('#ferry-sidebar .ferry-card').length === 2"
            )
            shown = cards(page)
            # A push where only the model is left: the encoder's card goes.
            page.evaluate(
                "p => window.ferryApi.push('ferry.stats', p)", {**payload, "offloads": [model]}
            )
            page.wait_for_function(
                "() => document.querySelectorAll('#ferry-sidebar .ferry-card').length === 1"
            )
            after = cards(page)
        finally:
            browser.close()
    assert [(c["kind"], c["title"]) for c in shown] == [
        ("model", f"model: {MODEL_NAME}"),
        ("text_encoder", f"text encoder: {TE_NAME}"),
    ]
    text = shown[1]["text"]
    # Where its weights are, in GiB/MiB (units.py), its disk rate in GB/s, its stall in s.
    assert "block / disk" in text and "weights on disk" in text, text
    assert f"{te['disk_gbps']:.2f} GB/s" in text, text
    assert f"{te['stall_s']:.3f} s" in text, text
    assert "weights on ram" in shown[0]["text"] and "weights on disk" not in shown[0]["text"]
    assert [c["title"] for c in after] == [f"model: {MODEL_NAME}"]


def test_plan_this_workflow_lists_each_network_and_why(site: tuple[str, Path]) -> None:
    url, stats_file = site
    stats_file.write_text(json.dumps(stats.stats_payload(None, [], None)))
    plan_file = stats_file.parent / "plan"
    reason = (
        "disk: 2.45 GiB text encoder t5, 1.03 GiB RAM available after the model flux's 2.23 GiB"
    )
    plan_file.write_text(json.dumps({
        "fits": True, "verdict": "fits: peak RAM 3.56 GiB (3.58 GiB for Ferry), disk 0 B",
        "peak_ram": 3.56 * 2**30, "peak_vram": None, "disk_bytes": 0,
        "networks": [{"name": "t5", "title": "text encoder t5", "tier": "disk",
                      "files": ["/models/text_encoders/t5.safetensors"], "bytes": 2.45 * 2**30,
                      "ferry_node": "11", "reason": reason}],
    }))  # fmt: skip
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(30_000)
            page.goto(url + "/index.html")
            page.click("#ferry-plan-btn")
            page.wait_for_selector("#ferry-plan [data-ferry-plan='t5']")
            text = page.inner_text("#ferry-plan")
        finally:
            browser.close()
    sent = json.loads((stats_file.parent / "plan.sent").read_text())
    assert sent == {"prompt": {"1": {"class_type": "UNETLoader", "inputs": {}}}}
    assert "text encoder t5 → disk" in text and "t5.safetensors, 2.45 GiB" in text
    assert reason in text and "fits: peak RAM 3.56 GiB" in text
    assert "predicted peak: RAM 3.56 GiB, disk 0 B" in text


def test_the_sidebar_speaks_the_users_language(graph: Graph, site: tuple[str, Path]) -> None:
    # Comfy.Locale zh: every label from locales/zh/main.json, the numbers as in English.
    url, stats_file = site
    stats_file.write_text(json.dumps(stats.stats_payload(None, monitor.read_offloads(), None)))
    zh = locales.read("zh", "main.json")["ferry"]["sidebar"]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(30_000)
            page.add_init_script("window.ferrySettings = {'Comfy.Locale': 'zh'}")
            page.goto(url + "/index.html")
            page.wait_for_function(
                "() => document.querySelectorAll('#ferry-sidebar .ferry-card').length === 2"
            )
            text = page.inner_text("#ferry-sidebar")
            tooltip = page.evaluate("() => window.ferryTabTooltip")
        finally:
            browser.close()
    for key in ("memory", "bytesMoved", "openPanel", "levelTier", "forwards", "stall"):
        assert zh[key] in text, (key, text)
    assert zh["weightsOn"].replace("{tier}", "disk") in text, text
    assert "bytes moved" not in text and "Open Ferry panel" not in text
    assert tooltip == zh["tooltip"]
