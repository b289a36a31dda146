"""The Ferry sidebar tab in a real browser (chromium + playwright) against the real server:
its numbers change while a prompt runs. FERRY_SCREENSHOT=<png> keeps the screenshot."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import comfy_checkout
from ferry_workflows import Client, error_message, ferry, graph

pytestmark = pytest.mark.browser
CHROMIUM = os.environ.get("FERRY_CHROMIUM", "/usr/bin/chromium")
# Flags that let chromium start on a headless CI machine: no GPU, no user namespace for its
# sandbox, and no network (it would otherwise fetch components and wait on them).
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]  # fmt: skip


def _moved(text: str) -> str | None:
    m = re.search(r"bytes moved\s+([\d.]+ \w+)", text)
    return m.group(1) if m else None


def test_sidebar_shows_live_numbers_while_a_prompt_runs(server: Any, tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium, or set FERRY_CHROMIUM)")
    shot = Path(os.environ.get("FERRY_SCREENSHOT") or tmp_path / "comfyui-sidebar.png")
    client = Client(server.url)
    # A slower prompt (leaf level from disk, more steps) so the numbers move on screen.
    g = graph([ferry(tier="disk", level="leaf", prefetch_depth=2)], "sidebar", seed=11)
    g["4"]["inputs"].update(width=256, height=256)
    g["5"]["inputs"]["steps"] = 150  # >= 4 one-second pushes even on a quiet machine
    # A fresh user folder opens the templates dialog over the canvas on first visit.
    client.post("/settings/Comfy.TutorialCompleted", True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 860})
            pushes: set[float] = set()  # sample times of the server's ferry.stats events

            def on_frame(frame: Any) -> None:
                if '"ferry.stats"' in str(frame):
                    # The page may hold more than one socket: count each sample once.
                    pushes.add(json.loads(frame)["data"]["t"])

            def on_ws(ws: Any) -> None:
                ws.on("framereceived", on_frame)

            page.on("websocket", on_ws)
            page.goto(server.url + "/", wait_until="networkidle", timeout=120_000)
            if page.locator(".p-dialog-mask").count():
                page.keyboard.press("Escape")
            page.click(".ferry-tab-button")  # the tab registerSidebarTab added
            page.wait_for_selector("#ferry-sidebar .ferry-section", timeout=30_000)
            # Show the same graph on the canvas that the server runs.
            page.evaluate("(g) => window.comfyAPI.app.app.loadApiJson(g, 'ferry-demo')", g)
            result: dict[str, Any] = {}
            runner = threading.Thread(
                target=lambda: result.update(entry=client.run(g, timeout=600))
            )
            runner.start()
            page.wait_for_selector("#ferry-sidebar .ferry-card", timeout=60_000)
            # Wait for this prompt's layout (an earlier test's may still be shown) to have run.
            page.wait_for_function(
                "() => /leaf \\/ disk[\\s\\S]*forwards\\s+([2-9]|\\d\\d)/"
                ".test(document.querySelector('#ferry-sidebar').innerText)",
                timeout=120_000,
            )
            first = _moved(page.inner_text("#ferry-sidebar"))
            page.wait_for_timeout(2500)
            text = page.inner_text("#ferry-sidebar")
            second = _moved(text)
            shot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shot))
            runner.join(timeout=600)
        finally:
            browser.close()
    assert result["entry"]["status"]["status_str"] == "success", error_message(result["entry"])
    # Pushed about once a second while the model is offloaded.
    gaps = sorted(b - a for a, b in itertools.pairwise(sorted(pushes)))
    assert len(pushes) >= 4, pushes
    assert 0.5 < gaps[len(gaps) // 2] < 2.0, gaps
    assert first and second and first != second, (first, second)
    assert "leaf / disk" in text and "RAM anon (process)" in text
    assert shot.stat().st_size > 10_000


def test_open_panel_button_starts_the_gradio_panel(server: Any) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM}")
    client = Client(server.url)
    # A bad body is a 400 before the route looks for gradio: ask ComfyUI's Python itself.
    _, py = comfy_checkout()
    if subprocess.run([py, "-c", "import gradio"], capture_output=True).returncode != 0:
        pytest.skip("no gradio in ComfyUI's Python (pip install 'gradio>=6,<7' there)")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client.post("/settings/Comfy.TutorialCompleted", True)
    client.post("/settings/Ferry.Panel.Port", port)  # the setting the extension declares
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 860})
            page.goto(server.url + "/", wait_until="networkidle", timeout=120_000)
            if page.locator(".p-dialog-mask").count():
                page.keyboard.press("Escape")
            page.click(".ferry-tab-button")
            try:
                # The first start imports gradio and builds the app: slow on a busy 2-core box.
                with page.expect_popup(timeout=240_000) as popup_info:
                    page.click("#ferry-sidebar .ferry-btn")
            except sync_api.TimeoutError:
                pytest.fail(
                    f"no panel window; the sidebar says: {page.inner_text('#ferry-sidebar')[:300]}"
                )
            panel = popup_info.value
            panel.wait_for_load_state("load", timeout=60_000)  # a Gradio page never idles
            assert panel.url.startswith(f"http://127.0.0.1:{port}")
            panel.wait_for_selector("text=Ferry", timeout=60_000)
            assert f"panel: http://127.0.0.1:{port}/" in page.inner_text("#ferry-sidebar")
        finally:
            browser.close()
