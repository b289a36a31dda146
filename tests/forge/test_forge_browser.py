"""Real Forge in headless Chromium: the Ferry tab and the "Ferry offload" accordion render on
Forge's Gradio, Save writes the settings file, the accordion generates with it (and refuses a
bad setting where the user sees it), and ComfyUI's node reads the same file.

Screenshots go to $FERRY_FORGE_SCREENSHOTS when set (docs/img holds the committed ones),
else to the test's temporary folder.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from forge_client import ferry
from forge_server import REPO, Server

sync_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = os.environ.get("FERRY_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]  # fmt: skip


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = os.environ.get("FERRY_FORGE_SCREENSHOTS")
    return Path(out) if out else tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="module")
def page(server: Server) -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium)")
    errors: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        pg = browser.new_page(viewport={"width": 1500, "height": 1400})
        pg.set_default_timeout(120_000)
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.goto(server.forge.url)
        pg.locator("#txt2img_generate").wait_for()
        pg.page_errors = errors  # type: ignore[attr-defined]
        yield pg
        browser.close()


def _wait_text(page: Any, selector: str, text: str) -> str:
    page.wait_for_function(
        "([s, t]) => { const e = document.querySelector(s); return e && e.innerText.includes(t); }",
        arg=[selector, text],
    )
    return str(page.locator(selector).inner_text())


def _tab(page: Any, name: str) -> None:
    page.locator("#tabs > .tab-nav button", has_text=name).first.click()


def test_the_ferry_tab_renders_and_save_writes_the_settings_file(
    page: Any, server: Server, tmp_path: Path
) -> None:
    _tab(page, "Ferry")
    status = _wait_text(page, "#ferry-monitor-status", "samples")
    assert "sampling every second" in status
    page.locator("#ferry-ram-plot canvas, #ferry-ram-plot svg").first.wait_for()
    # The saved values are loaded into the form, and the preview is planned on Forge's UNet.
    _wait_text(page, "#ferry-settings-file", str(server.settings))
    intro = page.locator("#ferry-settings-intro").inner_text()
    assert "Apply releases the UNet's layout; the next generation lays it out again" in intro
    page.locator("#ferry-tier label", has_text="Disk (SSD/NVMe)").click()
    field = page.locator("#ferry-disk-path textarea, #ferry-disk-path input").first
    field.fill(str(tmp_path / "forge-disk"))
    _wait_text(page, "#ferry-disk-check", "will be created")
    page.locator("#ferry-level label", has_text="Layer by layer").click()
    look = page.locator("#ferry-prefetch input[type=number]")
    look.fill("2")
    look.press("Enter")
    page.click("#ferry-save")
    msg = _wait_text(page, "#ferry-settings-status", "Saved to")
    assert "Use saved settings" in msg, msg
    saved = json.loads(server.settings.read_text())["policy"]
    assert (saved["level"], saved["tier"], saved["prefetch_depth"]) == ("leaf", "disk", 2)
    assert saved["disk_path"] == str(tmp_path / "forge-disk")


def _generate(page: Any) -> str:
    """Clicks Generate in txt2img; returns the parameters under the image, or Forge's error
    box (which it fills instead when a generation fails)."""
    info, log = page.locator("#html_info_txt2img"), page.locator("#html_log_txt2img")
    before = info.inner_text() + "|" + log.inner_text()
    page.click("#txt2img_generate")
    page.wait_for_function(
        "b => { const i = document.querySelector('#html_info_txt2img');"
        " const l = document.querySelector('#html_log_txt2img');"
        " const now = (i ? i.innerText : '') + '|' + (l ? l.innerText : '');"
        " const err = l && l.querySelector('.error');"
        " return now !== b && ((i && i.innerText.trim()) || err); }",
        arg=before,
        timeout=600_000,
    )
    error = log.locator(".error")
    return str(error.inner_text() if error.count() else info.inner_text())


def test_the_accordion_generates_with_its_settings_and_with_the_saved_ones(
    page: Any, server: Server, shots: Path
) -> None:
    _tab(page, "Txt2img")
    page.locator("#txt2img_prompt textarea").fill("a ferry at dusk")
    for sel, value in (
        ("#txt2img_width", "64"),
        ("#txt2img_height", "64"),
        ("#txt2img_steps", "2"),
    ):
        box = page.locator(f"{sel} input[type=number]")
        box.fill(value)
        box.press("Enter")
    acc = page.locator("#txt2img_ferry_offload")
    acc.scroll_into_view_if_needed()
    acc.locator(".label-wrap").first.click()  # opening the accordion turns Ferry on
    acc.locator("#txt2img_ferry_level").wait_for()
    acc.screenshot(path=str(shots / "forge-accordion.png"))
    # As a new user finds it: tier, blocks per group and look-ahead on auto. The image's
    # parameters say what the planner chose, and it is what ran.
    info = _generate(page)
    auto = re.search(r'Ferry: "block (\d+), (\w+), look-ahead (\d+), VRAM budget auto"', info)
    assert auto is not None, info
    (o,) = server.forge.stats()["offloads"]
    assert (o["tier"], o["level"], o["prefetch_depth"]) == (auto[2], "block", int(auto[3]))
    # Set by hand: the RAM tier, 1 block per group, look-ahead 1.
    page.locator("#txt2img_ferry_tier label").get_by_text("RAM", exact=True).click()
    for sel in ("#txt2img_ferry_blocks", "#txt2img_ferry_prefetch"):
        box = page.locator(f"{sel} textarea, {sel} input").first
        box.fill("1")
        box.press("Tab")
    info = _generate(page)
    assert 'Ferry: "block 1, ram, look-ahead 1, VRAM budget auto"' in info, info
    (o,) = server.forge.stats()["offloads"]
    assert (o["tier"], o["level"]) == ("ram", "block")
    # The settings the Ferry tab saved (leaf, disk, look-ahead 2): Use saved settings.
    page.locator("#txt2img_ferry_use_saved input[type=checkbox]").check()
    info = _generate(page)
    assert 'Ferry: "leaf, disk, look-ahead 2' in info, info
    (o,) = server.forge.stats()["offloads"]
    assert (o["tier"], o["level"], o["prefetch_depth"]) == ("disk", "leaf", 2)
    page.locator("#txt2img_ferry_use_saved input[type=checkbox]").uncheck()


def test_a_refusal_reaches_the_user(page: Any, server: Server) -> None:
    box = page.locator("#txt2img_ferry_blocks textarea, #txt2img_ferry_blocks input").first
    box.fill("20")
    box.press("Tab")
    info = _generate(page)
    assert "Ferry offload › Blocks per group: this model has at most 12 blocks in a row" in info, (
        info
    )
    box.fill("1")
    box.press("Tab")
    assert 'Ferry: "block 1, ram' in _generate(page)
    assert not [e for e in page.page_errors if "ferry" in e.lower()], page.page_errors


def test_the_text_encoder_box_encodes_through_ferry(page: Any, server: Server) -> None:
    """Ticked, the prompt (a new one: Forge encodes only a changed prompt) is encoded through
    Ferry; unticked, the text encoder's layout is released at the next encode."""
    box = page.locator("#txt2img_ferry_text_encoder input[type=checkbox]")
    box.check()
    page.locator("#txt2img_prompt textarea").fill("a ferry at dawn")
    info = _generate(page)
    assert 'Ferry: "block 1, ram, look-ahead 1, VRAM budget auto, text encoder too"' in info, info
    names = sorted(o["name"] for o in server.forge.stats()["offloads"])
    # The text encoder's line is named by the encoders Forge's CLIP holds (webui/script.py).
    assert names == ["clip_l", "ferry-sd15-a"], names
    box.uncheck()
    page.locator("#txt2img_prompt textarea").fill("a ferry at dusk")
    assert "text encoder too" not in _generate(page)
    assert [o["name"] for o in server.forge.stats()["offloads"]] == ["ferry-sd15-a"]


def test_the_tab_plans_on_forges_unet_and_shows_the_live_offload(
    page: Any, server: Server, shots: Path
) -> None:
    """After a generation the UNet is loaded: the preview plans on it, the table shows it."""
    page.reload()
    page.locator("#txt2img_generate").wait_for()
    _tab(page, "Ferry")
    summary = _wait_text(page, "#ferry-plan-summary", "groups")
    assert "blocks per group can go up to 12 for this model" in summary, summary
    _wait_text(page, "#ferry-offloads", "ferry-sd15-a")
    page.wait_for_timeout(1500)  # a tick or two of the live plots
    page.locator("#tab_ferry_panel").screenshot(path=str(shots / "forge-tab.png"))
    # Apply, between generations: the layout is released; the next generation lays it out.
    assert server.forge.stats()["offloads"]
    page.click("#ferry-apply")
    msg = _wait_text(page, "#ferry-settings-status", "released")
    assert "the next generation lays it out with the accordion's settings" in msg, msg
    assert server.forge.stats()["offloads"] == []


def test_the_plan_button_shows_the_planners_choice_and_moves_nothing(
    page: Any, server: Server, shots: Path
) -> None:
    """The accordion's Plan button on Forge's Gradio: the planner's choice for the loaded
    checkpoint's UNet and text encoder (webui/plan.py), with no layout made or released."""
    server.forge.txt2img(ferry(enabled=False))  # a checkpoint loaded, whatever ran before
    _tab(page, "Txt2img")
    acc = page.locator("#txt2img_ferry_offload")
    acc.scroll_into_view_if_needed()
    opened = not acc.locator("#txt2img_ferry_plan").is_visible()
    if opened:
        acc.locator(".label-wrap").first.click()
    box = page.locator("#txt2img_ferry_text_encoder input[type=checkbox]")
    box.check()
    # The plan counts the generation the sliders set: 5 steps at CFG 1 (one pass a step).
    for sel, value in (("#txt2img_steps", "5"), ("#txt2img_cfg_scale", "1")):
        field = page.locator(f"{sel} input[type=number]")
        field.fill(value)
        field.press("Enter")
    before = server.forge.stats()
    page.click("#txt2img_ferry_plan")
    text = _wait_text(page, "#txt2img_ferry_plan_text", "The accordion's settings")
    assert "UNet (ferry-sd15-a, " in text and "Text encoder (clip_l, " in text, text
    assert text.count("Why: ") == 2 and "Predicted: " in text, text
    assert "Planned for 5 steps at CFG 1 (one pass a step" in text, text
    assert "the UNet is read 5 times a generation" in text, text
    page.locator("#txt2img_ferry_plan_text").screenshot(path=str(shots / "forge-plan.png"))
    after = server.forge.stats()
    assert [after[k] for k in ("layouts", "releases")] == [
        before[k] for k in ("layouts", "releases")
    ]
    box.uncheck()
    if opened:  # as it was: closed is Ferry off for the tests after this one
        acc.locator(".label-wrap").first.click()
    assert not [e for e in page.page_errors if "ferry" in e.lower()], page.page_errors


def _comfyui_helpers() -> Any:
    """tests/comfyui's launcher, loaded by path (its conftest is not this suite's)."""
    here = REPO / "tests" / "comfyui"
    sys.path.insert(0, str(here))
    spec = importlib.util.spec_from_file_location("ferry_comfyui_launcher", here / "conftest.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_comfyui_reads_what_forges_tab_saved(server: Server, tmp_path: Path) -> None:
    """The same file, read by the ComfyUI node with use_panel_settings (real ComfyUI)."""
    if not os.environ.get("FERRY_COMFYUI"):
        pytest.skip("set FERRY_COMFYUI too to check the ComfyUI node reads Forge's saved settings")
    saved = json.loads(server.settings.read_text())
    comfy = _comfyui_helpers()
    from ferry_workflows import Client, ferry, graph

    checkout, py = comfy.comfy_checkout()
    base = tmp_path / "comfy-base"
    base.mkdir()
    comfy.make_base(base, py, checkout)
    (base / "ferry-settings.json").write_text(server.settings.read_text())
    srv = comfy.start_server(checkout, py, base)
    try:
        client = Client(srv.url)
        assert client.get("/ferry/settings")["settings"] == saved
        entry = client.run(graph([ferry(use_panel_settings=True, tier="pinned")], "forge-saved"))
        assert entry["status"]["status_str"] == "success", entry["status"]
        (o,) = client.get("/ferry/stats")["offloads"]
        policy = saved["policy"]
        assert (o["tier"], o["level"], o["prefetch_depth"]) == (
            policy["tier"], policy["level"], policy["prefetch_depth"],
        )  # fmt: skip
    finally:
        comfy.stop_server(srv)
