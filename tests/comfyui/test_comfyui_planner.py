"""The planner in real ComfyUI (issue 37): every Ferry setting on "auto" gives the plain
latent and says why; the pre-flight route plans a workflow from its files' headers; a budget
set through the route changes the next prompt's layout, with no restart.

    FERRY_COMFYUI=/work/comfy/v0.33.0 python -m pytest tests/comfyui/test_comfyui_planner.py
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch
from ferry_workflows import (
    AUTO,
    MODEL_FILE,
    Client,
    error_message,
    ferry,
    graph,
    saved_latent_name,
)
from safetensors.torch import load_file

FERRY_LOADER = (
    "FerryLoadDiffusionModelQuantized",
    {"unet_name": MODEL_FILE, "quant_preset": "none", "cache": True, "weight_dtype": "default"},
)
GIB = 1 << 30


@pytest.fixture(scope="module")
def client(server: Any) -> Client:
    return Client(server.url)


def run_ok(client: Client, server: Any, g: dict[str, Any]) -> torch.Tensor:
    entry = client.run(g)
    assert entry["status"]["status_str"] == "success", (
        f"{error_message(entry)}\n{server.log_tail()}"
    )
    return load_file(str(server.base / "output" / saved_latent_name(entry)))["latent_tensor"]


@pytest.fixture(scope="module")
def reference(client: Client, server: Any) -> torch.Tensor:
    return run_ok(client, server, graph([], "planner-plain"))


def test_every_setting_on_auto_gives_the_plain_latent_and_says_why(
    client: Client, server: Any, reference: torch.Tensor
) -> None:
    got = run_ok(client, server, graph([ferry(**AUTO)], "planner-auto", loader=FERRY_LOADER))
    assert torch.equal(got, reference)
    (line,) = client.live()
    assert line["why"] and line["why"].startswith(f"{line['tier']}: "), line
    assert "ahead" in line["why"] and "GiB" in line["why"]
    log = server.log.read_text(errors="replace")
    assert "ferry plan: model " in log


def test_the_preflight_plans_a_workflow_from_headers(client: Client) -> None:
    g = graph([ferry(**AUTO)], "planner-preflight", loader=FERRY_LOADER)
    start = time.perf_counter()
    status, body = client.post("/ferry/plan", {"prompt": g, "client_id": "x"})
    took = time.perf_counter() - start
    assert status == 200, body
    assert took < 1.0, f"the pre-flight took {took:.2f} s"
    (net,) = body["networks"]
    assert net["files"][0].endswith(MODEL_FILE) and net["ferry_node"] == "10"
    assert net["tier"] in ("ram", "disk") and net["reason"].startswith(net["tier"])
    assert body["fits"] and body["verdict"].startswith("fits: ") and body["peak_ram"] > 0
    status, bad = client.post("/ferry/plan", {"prompt": {"1": {"inputs": {}}}})
    assert status == 400 and bad["setting"] == "prompt.1.class_type"


def test_a_budget_set_through_the_route_applies_next_prompt(
    client: Client, server: Any, reference: torch.Tensor
) -> None:
    g = graph([ferry(**AUTO)], "planner-budget", loader=FERRY_LOADER)
    assert client.post("/ferry/budgets", {"vram_gb": None, "ram_gb": None})[0] == 200
    assert torch.equal(run_ok(client, server, g), reference)
    (before,) = client.live()
    assert before["resident_groups"] == 0  # a CPU: "auto" keeps nothing on the device
    _, plan = client.post("/ferry/plan", {"prompt": g})
    # More than the model: on a CPU a VRAM budget keeps that much on the onload device.
    budget = plan["networks"][0]["bytes"] * 2 / GIB
    try:
        status, body = client.post("/ferry/budgets", {"vram_gb": budget})
        assert status == 200, body
        assert torch.equal(run_ok(client, server, g), reference)  # no restart
        (after,) = client.live()
        assert after["resident_groups"] == after["groups"] > 0, after
        assert "whole while it runs" in after["why"]
    finally:
        client.post("/ferry/budgets", {"vram_gb": None, "ram_gb": None})


@pytest.mark.browser
def test_the_sidebars_plan_button_shows_the_plan(server: Any) -> None:
    """Debian's chromium: "Plan this workflow" on the graph in the canvas lists its network,
    where Ferry puts it and why. FERRY_SCREENSHOT=<png> keeps the screenshot (docs/img)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    from frontend_page import load_api_workflow, open_frontend
    from test_comfyui_sidebar import CHROMIUM, FLAGS

    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no chromium at {CHROMIUM}")
    client = Client(server.url)
    client.post("/settings/Comfy.TutorialCompleted", True)
    g = graph([ferry(**AUTO)], "planner-browser", loader=FERRY_LOADER)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 860})
            # As a user loads a workflow: once the app is set up. v0.3.64's frontend (1.27.10)
            # is not at networkidle; a graph loaded then was replaced by the default workflow,
            # which the Plan button sent instead (with its checkpoint loader, a node that
            # frontend fails to build, without a class_type).
            open_frontend(page, server.url)
            load_api_workflow(page, g, "ferry-plan", shows="FerryOffloadModel")
            page.click(".ferry-tab-button")
            page.click("#ferry-plan-btn")
            try:
                page.wait_for_selector("#ferry-plan [data-ferry-plan]", timeout=60_000)
            except sync_api.TimeoutError:
                pytest.fail(f"no plan; the section says: {page.inner_text('#ferry-plan')[:500]}")
            text = page.inner_text("#ferry-plan")
            shot = os.environ.get("FERRY_SCREENSHOT")
            if shot:
                page.screenshot(path=shot)
        finally:
            browser.close()
    assert "fits: peak RAM" in text and "predicted peak" in text
    assert f"model {MODEL_FILE.removesuffix('.safetensors')} →" in text
    assert "groups of" in text and "ahead" in text


def test_a_disk_folder_too_small_is_refused_before_any_load(
    client: Client, server: Any, tmp_path: Any
) -> None:
    """tier disk, forced, in a 1 MiB filesystem, for a model its loader converts to fp8 (so
    the disk tier must write it): the prompt fails naming disk_path, and nothing was laid
    out."""
    from tests.helpers import tmpfs

    loader = (FERRY_LOADER[0], {**FERRY_LOADER[1], "weight_dtype": "fp8_e4m3fn"})
    with tmpfs(tmp_path / "tiny-disk", "1m") as small:
        g = graph([ferry(tier="disk", disk_path=str(small))], "planner-refused", loader=loader)
        laid = server.log.read_text(errors="replace").count("ferry: laid out")
        entry = client.run(g)
        assert entry["status"]["status_str"] == "error"
        message = error_message(entry)
        assert "disk_path: " in message and f"{small} has " in message, message
        assert "writes" in message and "choose a folder with room" in message
        assert server.log.read_text(errors="replace").count("ferry: laid out") == laid
        # No group file; the plan may leave the folder's read speed (the first plan of a
        # folder probes it, issue 47), nothing else.
        left = sorted(p.name for p in small.iterdir())
        assert left in ([], [".ferry-disk-speed.json"]), left
