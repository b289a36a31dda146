"""The sidebar's two pictures in Debian's chromium on ComfyUI's real frontend, in English and
Chinese (issue 50): the pre-flight's bars per network ("Plan this workflow": where its bytes
wait against the machine's room, and its time), and during a run the live group strip of the
offload's card, whose cells change as the engine moves groups (the server's pushed stats).
Screenshots: docs/img/comfyui-plan-picture-<lang>.png and comfyui-group-strip-<lang>.png
(FERRY_PICTURES=<folder> puts them elsewhere)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from ferry_workflows import Client, error_message, ferry, graph
from frontend_page import CHROMIUM, FLAGS, close_dialogs

pytestmark = pytest.mark.browser
REPO = Path(__file__).resolve().parents[2]
LOCALES = REPO / "locales"


def _words(lang: str) -> dict[str, str]:
    return json.loads((LOCALES / lang / "main.json").read_text(encoding="utf-8"))["ferry"][
        "sidebar"
    ]  # type: ignore[no-any-return]


def _shot(page: Any, path: Path) -> None:
    """The sidebar and a strip of the canvas beside it."""
    box = page.locator("#ferry-plan").bounding_box()
    path.parent.mkdir(parents=True, exist_ok=True)
    width = min(page.viewport_size["width"], int(box["x"] + box["width"] + 260))
    page.screenshot(
        path=str(path),
        clip={"x": 0, "y": 0, "width": width, "height": page.viewport_size["height"]},
    )


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_plan_picture_and_live_group_strip(server: Any, lang: str) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium)")
    out = Path(os.environ.get("FERRY_PICTURES") or REPO / "docs" / "img")
    words = _words(lang)
    client = Client(server.url)
    # A group per layer (leaf) from disk, one ahead: the strip has many cells to move. A
    # 256 x 256 latent, so that a forward (where groups move) is most of a step and the
    # one-second pushes land inside forwards, not only between them (where the strip holds
    # the next forward's first groups); 20 steps last many pushes.
    # Each language its own seed: the same one would find the sampler's output cached.
    seed = {"en": 5, "zh": 6}[lang]
    g = graph([ferry(tier="disk", level="leaf", prefetch_depth=1)], f"pictures-{lang}", seed=seed)
    g["4"]["inputs"].update(width=256, height=256)
    g["5"]["inputs"]["steps"] = 20
    client.post("/settings/Comfy.TutorialCompleted", True)
    client.post("/settings/Comfy.Locale", lang)
    strips: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(server.url + "/", wait_until="networkidle", timeout=120_000)
            page.wait_for_function("() => window.comfyAPI?.app?.app?.graph", timeout=60_000)
            close_dialogs(page)
            page.click(".ferry-tab-button")
            page.wait_for_selector("#ferry-plan-btn", timeout=30_000)
            page.evaluate("(g) => window.comfyAPI.app.app.loadApiJson(g, 'ferry-pictures')", g)
            # The pre-flight's picture: three bars for the model, and its time.
            page.click("#ferry-plan-btn")
            page.wait_for_selector("[data-ferry-picture] [data-ferry-bar='disk']", timeout=120_000)
            bars = page.eval_on_selector_all(
                "[data-ferry-picture] [data-ferry-bar]",
                "rs => rs.map(r => ({kind: r.dataset.ferryBar, share: Number(r.dataset.ferryShare),"
                " text: r.innerText}))",
            )
            picture = page.inner_text("[data-ferry-picture]")
            _shot(page, out / f"comfyui-plan-picture-{lang}.png")

            result: dict[str, Any] = {}
            runner = threading.Thread(
                target=lambda: result.update(entry=client.run(g, timeout=900))
            )
            runner.start()
            shot_taken = False
            deadline = time.monotonic() + 900
            while runner.is_alive() and time.monotonic() < deadline:
                s = page.evaluate(
                    "() => document.querySelector('#ferry-sidebar [data-ferry-strip]')"
                    "?.dataset.ferryStrip ?? null"
                )
                if s:
                    strips.append(s)
                if not shot_taken and len(set(strips)) >= 3 and s and "d" in s:
                    # The card is redrawn every second: scrolled in one step, in the page.
                    page.evaluate(
                        "() => document.querySelector('#ferry-sidebar [data-ferry-strip]')"
                        "?.scrollIntoView({ block: 'center' })"
                    )
                    legend = page.inner_text("#ferry-sidebar .ferry-strip-legend")
                    _shot(page, out / f"comfyui-group-strip-{lang}.png")
                    shot_taken = True
                page.wait_for_timeout(200)
            runner.join(timeout=60)
        finally:
            browser.close()
    assert result["entry"]["status"]["status_str"] == "success", error_message(result["entry"])
    # The picture: a bar each for VRAM (none on this CPU), RAM and disk, in the user's words.
    kinds = [b["kind"] for b in bars]
    assert kinds == ["vram", "ram", "disk"], bars
    assert words["pictureNoGpu"] in picture, picture
    disk = bars[2]
    assert 0 < disk["share"] <= 1, bars  # the model's bytes against the disk folder's room
    assert words["pictureTransferBound"] in picture, picture
    head = words["pictureTime"].split("{")[0]
    assert head.strip() in picture, picture
    # The strip: one cell per group, and it moved with the run (the engine's real states).
    assert shot_taken, (len(strips), sorted(set(strips)))
    assert len(set(strips)) >= 3, (len(strips), sorted(set(strips)))
    assert all(set(s) <= set("rdfw") and len(s) == len(strips[0]) for s in strips), strips
    assert any("d" in s and "w" in s for s in strips), strips
    assert words["stripWaiting"].replace("{count}", "").strip() in legend, legend
