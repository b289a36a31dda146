"""The panel started in-process by a host (ComfyUI's sidebar button): no demo model; it sees
the host's live offloads, bounds the block count by them, and Apply re-offloads them, through
the host's hook when it gives one, and never while the host says a job runs."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

pytest.importorskip("gradio")
from gradio_client import Client

from ._panel_server import free_port

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:.*:Warning:gradio")


class Host:
    def __init__(self) -> None:
        self.busy = False
        self.calls: list[tuple[str, Any]] = []


@pytest.fixture(scope="module")
def hosted(pack: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, ...]]:
    panel = importlib.import_module(f"{pack.__name__}.web.panel")
    oc = importlib.import_module(f"{pack.__name__}.offload_core")
    demo_model = importlib.import_module(f"{pack.__name__}.offload_core.model.demo")
    host = Host()

    def hook(handle: Any, policy: Any) -> str:
        host.calls.append((handle.name, policy))
        model, name = handle.model, handle.name
        handle.remove()
        oc.apply_offload(model, policy, onload_device="cpu", name=name)
        return f"{name}: re-offloaded by the host"

    tmp = tmp_path_factory.mktemp("panel-host")
    url = panel.launch_panel(port=free_port(), settings_path=tmp / "s.json", is_busy=lambda: host.busy,
                             reapply_hook=hook)  # fmt: skip
    model = demo_model.build_demo_model(0.002, torch.float32)
    try:
        yield Client(url, verbose=False), host, oc, model
    finally:
        h = oc.find_offload(model)
        if h is not None:
            h.remove()
        panel.close_panel()


def test_before_any_model_is_loaded(hosted: tuple[Any, ...]) -> None:
    client, *_ = hosted
    _, summary = client.predict("block", 1, "ram", "", 1, "", 2.0, "none", api_name="/plan_preview")
    assert summary.startswith("No model loaded yet")
    assert client.predict(
        "block", 1, "ram", "", 1, "", 2.0, "none", api_name="/apply_settings"
    ).endswith("no offloaded model is loaded; the settings apply at the next load.")
    # No demo model inside a host: no button and no endpoint to run one.
    assert (
        "/run_demo"
        not in client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    )


def test_sees_the_hosts_model_and_applies_through_the_host(
    hosted: tuple[Any, ...], tmp_path: Path
) -> None:
    client, host, oc, model = hosted
    oc.apply_offload(model, oc.OffloadPolicy(level=oc.BlockLevel(1), tier=oc.RamTier()), onload_device="cpu",
                     name="unet")  # fmt: skip
    _, summary = client.predict("block", 2, "ram", "", 1, "", 2.0, "none", api_name="/plan_preview")
    assert "loaded model's **current** plan" in summary and "**6 groups**" in summary
    # The slider is re-bounded by the loaded model when a page loads.
    assert client.predict(api_name="/load_settings")[1]["maximum"] == 4
    host.busy = True
    msg = client.predict("block", 2, "ram", "", 1, "", 2.0, "none", api_name="/apply_settings")
    assert msg == "✖ Not applied. apply: a job is running; Apply again when it has finished"
    assert client.predict(None, None, 0.002, "", api_name="/run_planner")[3].startswith(
        "✖ run: a job is running"
    )
    assert host.calls == []
    host.busy = False
    msg = client.predict(
        "block", 2, "disk", str(tmp_path / "swap"), 1, "", 2.0, "none", api_name="/apply_settings"
    )
    assert msg == "✔ unet: re-offloaded by the host."
    h = oc.find_offload(model)
    assert h.policy == oc.OffloadPolicy(
        level=oc.BlockLevel(2), tier=oc.DiskTier(str(tmp_path / "swap"))
    )
    assert [c[0] for c in host.calls] == ["unet"]
