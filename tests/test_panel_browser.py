"""A real browser (Debian's chromium driven by playwright) on the real panel: the live plot
updates, changing the block count redraws the plan plot, the disk-folder check reacts as it is
typed, and a screenshot is saved under artifacts/ (git-ignored) as the test's artifact."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
pytest.importorskip("gradio")
sync_api = pytest.importorskip("playwright.sync_api")

from ._panel_server import RunningPanel, run_panel, run_panel_elsewhere  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("FERRY_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# Flags that let chromium start in a container without a GPU, a user namespace for its
# sandbox, or a network (it would otherwise try to fetch components and wait on them).
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]  # fmt: skip

if not Path(CHROMIUM).exists():
    pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)


GRADIO4_PYTHON = os.environ.get("FERRY_GRADIO4_PYTHON")


@pytest.fixture(scope="module", params=["gradio-6", "gradio-4.40"])
def running(
    request: pytest.FixtureRequest, pack: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningPanel]:
    """The same tests on both Gradios the panel supports: this venv's (6), in this process, and
    Forge's (4.40), tools/panel.py in the second venv `bash run.sh test` makes."""
    tmp = tmp_path_factory.mktemp("panel-browser")
    if request.param == "gradio-6":
        yield from run_panel(pack, tmp)
    elif not GRADIO4_PYTHON:
        pytest.skip("FERRY_GRADIO4_PYTHON is unset (bash run.sh test makes .venv-gradio4)")
    else:
        yield from run_panel_elsewhere(GRADIO4_PYTHON, tmp, "4.40.0")


@pytest.fixture(scope="module")
def page(running: RunningPanel) -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        pg = browser.new_page(viewport={"width": 1400, "height": 1500})
        pg.set_default_timeout(30_000)
        pg.goto(running.url)
        yield pg
        browser.close()


def _wait_text(page: Any, selector: str, text: str) -> str:
    page.wait_for_function(
        "([s, t]) => { const e = document.querySelector(s); return e && e.innerText.includes(t); }",
        arg=[selector, text],
    )
    return str(page.locator(selector).inner_text())


def _samples(page: Any) -> int:
    text = _wait_text(page, "#ferry-monitor-status", "samples")
    return int(text.split(" samples")[0].split("·")[-1].strip())


def test_live_plot_updates(page: Any) -> None:
    plot = page.locator("#ferry-ram-plot")
    plot.locator("canvas, svg").first.wait_for()
    n0, shot0 = _samples(page), plot.screenshot()
    time.sleep(3.5)
    n1, shot1 = _samples(page), plot.screenshot()
    assert n1 >= n0 + 2, "the timer should have brought new samples"
    assert shot1 != shot0, "the RAM plot should have been redrawn with them"


def test_block_count_redraws_the_plan_plot(page: Any) -> None:
    _wait_text(page, "#ferry-plan-summary", "6 groups")
    plot = page.locator("#ferry-plan-plot")
    plot.locator("canvas, svg").first.wait_for()
    before = plot.screenshot()
    box = page.locator("#ferry-blocks input[type=number]")
    box.fill("4")
    box.press("Enter")
    summary = _wait_text(page, "#ferry-plan-summary", "2 groups")
    assert "GPU at peak" in summary
    page.wait_for_timeout(500)  # the bar animates to its new height
    assert plot.screenshot() != before


def test_disk_path_check_reacts_as_typed(page: Any, tmp_path: Path) -> None:
    field = page.locator("#ferry-disk-path textarea, #ferry-disk-path input").first
    field.fill("")
    field.type("/etc/passwd", delay=10)
    _wait_text(page, "#ferry-disk-check", "is a file, not a folder")
    field.fill(str(tmp_path / "swap"))
    text = _wait_text(page, "#ferry-disk-check", "will be created")
    assert "GiB free" in text and "the offloaded groups need" in text
    assert not (tmp_path / "swap").exists()


def test_advanced_disk_options_save_into_the_settings_file(
    page: Any, running: RunningPanel, tmp_path: Path
) -> None:
    page.locator("#ferry-tier label", has_text="Disk (SSD/NVMe)").click()
    field = page.locator("#ferry-disk-path textarea, #ferry-disk-path input").first
    field.fill(str(tmp_path / "swap"))
    _wait_text(page, "#ferry-disk-check", "will be created")
    page.locator("#ferry-advanced").get_by_text("Advanced (disk tier)").click()
    direct = page.locator("#ferry-direct-io input[type=checkbox]")
    direct.wait_for()
    assert direct.is_checked(), "the default is O_DIRECT reads"
    direct.uncheck()
    page.locator("#ferry-verify label", has_text="Every read").click()
    page.locator("#ferry-cpu-read label", has_text="Copy into a buffer").click()
    page.click("#ferry-save")
    _wait_text(page, "#ferry-settings-status", "Saved to")
    saved = json.loads(running.settings_path.read_text())["policy"]
    assert saved["tier"] == "disk" and saved["disk_path"] == str(tmp_path / "swap")
    assert (saved["direct_io"], saved["verify"], saved["cpu_read"]) == (False, "every_read", "copy")


def test_planner_runs_from_the_page_with_its_defaults(page: Any) -> None:
    # The budgets are left as the page shows them (a CPU machine shows 0 = no VRAM limit).
    page.click("#ferry-tab-planner-button", force=True)  # the live plots keep re-laying out
    size = page.locator("#ferry-plan-size input")
    size.fill("0.002")
    size.press("Tab")
    page.click("#ferry-plan-run")
    verdict = _wait_text(page, "#ferry-plan-verdict", "recommended: #")
    assert verdict.startswith("✔")
    table = _wait_text(page, "#ferry-plan-table", "block x4, ram, prefetch 1")
    assert "block x1, ram, prefetch 2" in table and "fits" in table
    page.click("#ferry-plan-save")
    _wait_text(page, "#ferry-plan-saved", "Saved the recommended plan")


def test_group_strip_moves_while_the_demo_runs(page: Any) -> None:
    # The monitor's strip (web/panel/strip_view.py): a cell per group of the demo model,
    # redrawn every tick from the engine's group states while it runs.
    strip = "#ferry-group-strips [data-ferry-strip]"
    page.wait_for_selector(strip)
    page.click("#ferry-demo-run")
    seen = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(seen) < 3:
        seen.add(page.locator(strip).first.get_attribute("data-ferry-strip"))
        page.wait_for_timeout(250)
    assert len(seen) >= 3, seen
    assert all(s and set(s) <= set("rdfw") for s in seen), seen
    assert "waiting" in page.locator("#ferry-group-strips").inner_text()
    _wait_text(page, "#ferry-demo-status", "ran")


def test_screenshot_artifact(page: Any) -> None:
    out = REPO / "artifacts" / "panel-browser.png"
    out.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(out), full_page=True)
    assert out.stat().st_size > 20_000
