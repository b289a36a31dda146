"""The sidebar's pictures (web/comfyui/ferry_pictures.js) in Debian's chromium, without
ComfyUI (tests/test_sidebar_browser.py's stand-in site): the pre-flight's bars drawn from a
real plan's body (the planner's as_dict, as /ferry/plan answers), each bar's share the bytes
against the room; and the group strip redrawn from each push, in English and Chinese. On
ComfyUI's real frontend during a run: tests/comfyui/test_comfyui_pictures.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from offload_core.planner import MachineFacts, NetworkFacts, Wish, plan_graph
from offload_core.units import GIB
from tests import locales
from tests.test_sidebar_browser import CHROMIUM, FLAGS, site, stats, sync_api

pytestmark = pytest.mark.browser
__all__ = ["site"]  # the fixture, imported for the tests below


def _plan() -> dict[str, Any]:
    gpu = MachineFacts(
        vram_free=6 * GIB, ram_available=16 * GIB, disk_free=500 * GIB, disk_folder="/d"
    )
    n = 12 * GIB
    net = NetworkFacts(
        "flux", "model", n, (n // 16,) * 16, reads_per_prompt=40, wish=Wish(tier="disk")
    )  # type: ignore[arg-type]
    body = plan_graph(gpu, [net], steps=20).as_dict()
    body["networks"][0].update(files=["/models/flux.safetensors"], ferry_node="10")
    return body


def _open(page: Any, url: str, lang: str) -> None:
    page.set_default_timeout(30_000)
    page.add_init_script(f"window.ferrySettings = {{'Comfy.Locale': '{lang}'}}")
    page.goto(url + "/index.html")


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_plan_picture_draws_each_bar_against_the_room(
    site: tuple[str, Path], lang: str
) -> None:
    url, stats_file = site
    stats_file.write_text(json.dumps(stats.stats_payload(None, [], None)))
    plan = _plan()
    (stats_file.parent / "plan").write_text(json.dumps(plan))
    words = locales.read(lang, "main.json")["ferry"]["sidebar"]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page()
            _open(page, url, lang)
            page.click("#ferry-plan-btn")
            page.wait_for_selector("[data-ferry-picture='flux'] [data-ferry-bar='disk']")
            bars = page.eval_on_selector_all(
                "[data-ferry-picture='flux'] [data-ferry-bar]",
                "rs => rs.map(r => [r.dataset.ferryBar, Number(r.dataset.ferryShare), r.innerText,"
                " r.querySelector('.ferry-bar-fill').getBoundingClientRect().width /"
                " r.querySelector('.ferry-bar').getBoundingClientRect().width])",
            )
            text = page.inner_text("[data-ferry-picture='flux']")
        finally:
            browser.close()
    waits, room = plan["networks"][0]["waits"], plan["room"]
    assert [b[0] for b in bars] == ["vram", "ram", "disk"]
    for kind, share, _, drawn in bars:
        assert share == pytest.approx(waits[kind] / room[kind], abs=1e-4), kind
        assert drawn == pytest.approx(share, abs=0.02), (kind, drawn, share)  # as wide as said
    assert words["pictureDisk"].split("{")[0].strip() in bars[2][2]
    assert "12.00 GiB" in bars[2][2] and "500.00 GiB" in bars[2][2]
    assert words["pictureTransferBound"] in text


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_strip_follows_each_push(site: tuple[str, Path], lang: str) -> None:
    url, stats_file = site
    entry = {"name": "flux", "kind": "model", "title": "model: flux", "level": "block",
             "tier": "disk", "groups": 6, "resident_groups": 1, "group_states": "rdfwww"}  # fmt: skip
    payload = {**stats.stats_payload(None, [], None), "offloads": [entry]}
    stats_file.write_text(json.dumps(payload))
    words = locales.read(lang, "main.json")["ferry"]["sidebar"]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page()
            _open(page, url, lang)
            page.wait_for_selector("#ferry-sidebar [data-ferry-strip='rdfwww']")
            first = page.eval_on_selector_all(
                "#ferry-sidebar .ferry-strip .ferry-cell", "cs => cs.map(c => c.className)"
            )
            legend = page.inner_text("#ferry-sidebar .ferry-strip-legend")
            moved = {**payload, "offloads": [{**entry, "group_states": "rwwdfw"}]}
            page.evaluate("p => window.ferryApi.push('ferry.stats', p)", moved)
            page.wait_for_selector("#ferry-sidebar [data-ferry-strip='rwwdfw']")
            second = page.eval_on_selector_all(
                "#ferry-sidebar .ferry-strip .ferry-cell", "cs => cs.map(c => c.className)"
            )
        finally:
            browser.close()
    assert first == [f"ferry-cell {c}" for c in "rdfwww"]
    assert second == [f"ferry-cell {c}" for c in "rwwdfw"]
    for key, count in (
        ("stripOnDevice", 1),
        ("stripInFlight", 1),
        ("stripWaiting", 3),
        ("stripResident", 1),
    ):
        assert words[key].replace("{count}", str(count)) in legend, (key, legend)
