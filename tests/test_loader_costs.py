"""The loader-cost table (offload_core/planner/loader_costs.py) as the pre-flight uses it: a
core takes the row of the newest listed core not newer than it, and a loader that copies the
file while it loads raises the plan's peak RAM and says so. The figures themselves are
measured on each core by tests/comfyui/test_comfyui_loader_costs.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from offload_core.planner import MachineFacts, NetworkFacts, plan_graph
from offload_core.planner import loader_costs as lc

GIB = 1 << 30


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> dict[tuple[str, str], lc.LoaderCost]:
    rows = {
        ("UNETLoader", "0.3.64"): lc.LoaderCost(False, 2.1, 1.0),
        ("UNETLoader", "0.33.0"): lc.LoaderCost(True, 0.1, 0.0),
    }
    monkeypatch.setattr(lc, "LOADER_COSTS", rows)
    return rows


def test_a_core_takes_the_newest_row_not_newer_than_it(table: dict[Any, Any]) -> None:
    assert lc.loader_cost("UNETLoader", "0.3.64") == table[("UNETLoader", "0.3.64")]
    assert lc.loader_cost("UNETLoader", "0.8.0") == table[("UNETLoader", "0.3.64")]
    assert lc.loader_cost("UNETLoader", "0.33.0") == table[("UNETLoader", "0.33.0")]
    assert lc.loader_cost("UNETLoader", "0.40.1") == table[("UNETLoader", "0.33.0")]
    assert lc.loader_cost("UNETLoader", "0.3.10") is None  # older than every row
    assert lc.loader_cost("CLIPLoader", "0.33.0") is None  # no row: nothing said
    assert lc.load_sentence("CLIPLoader", "0.33.0") is None


def test_a_copying_core_loader_names_ferrys_that_maps(table: dict[Any, Any]) -> None:
    table[("FerryLoadDiffusionModelQuantized", "0.3.64")] = lc.LoaderCost(True, 0.01, 0.01)
    said = lc.load_sentence("UNETLoader", "0.3.64")
    assert said == (
        "UNETLoader on this ComfyUI copies the file into RAM: peak 2.1x the file while "
        "loading, 1.0x after; Ferry's loader maps it (peak 0.01x)"
    )
    mapped = lc.LoaderCost(True, 0.1, 0.0).sentence("UNETLoader")
    assert lc.load_sentence("UNETLoader", "0.33.0") == mapped  # it maps too: nothing to suggest


def test_a_copying_loaders_peak_is_the_plans_peak_and_is_said() -> None:
    machine = MachineFacts(vram_free=None, ram_available=64 * GIB)
    net = NetworkFacts("m", "model", 4 * GIB, (GIB,) * 4, ferry=False)
    steady = plan_graph(machine, [net])
    cost = lc.LoaderCost(False, 2.1, 1.0)
    loading = replace(
        net, load_peak_bytes=int(2.1 * 4 * GIB), load_said=cost.sentence("UNETLoader")
    )
    plan = plan_graph(machine, [loading])
    assert plan.peak_ram - steady.peak_ram == int(2.1 * 4 * GIB) - steady.choices[0].ram_bytes
    reason = plan.choices[0].reason
    assert reason.startswith("ram: ") and reason.endswith(
        "UNETLoader on this ComfyUI copies the file into RAM: peak 2.1x the file while "
        "loading, 1.0x after"
    )
    assert plan.as_dict()["networks"][0]["load_peak_bytes"] == int(2.1 * 4 * GIB)
    # A loader whose peak is below what the network holds once loaded changes no peak.
    light = replace(net, load_peak_bytes=GIB, load_said="x")
    assert plan_graph(machine, [light]).peak_ram == steady.peak_ram


def test_the_preflight_takes_the_loaders_peak_from_its_files_size(tmp_path: Path) -> None:
    import importlib

    from safetensors.torch import save_file

    from tests.conftest import PACK_NAME, load_pack

    load_pack()
    pn = importlib.import_module(f"{PACK_NAME}.nodes.planning.prompt_networks")
    tensors = {f"blocks.{i}.attn.weight": torch.zeros(64, 64) for i in range(4)}
    save_file(tensors, str(tmp_path / "m.safetensors"))
    size = (tmp_path / "m.safetensors").stat().st_size
    prompt = {"1": {"class_type": "UNETLoader",
                    "inputs": {"unet_name": "m.safetensors", "weight_dtype": "default"}}}  # fmt: skip
    cost = lc.LoaderCost(False, 2.0, 1.0)
    costs = {"UNETLoader": (cost, "said")}
    (net,) = pn.prompt_networks(
        prompt, lambda f, n: str(tmp_path / n), lambda k: None, costs=costs.get,
    )  # fmt: skip
    assert net.facts.load_peak_bytes == 2 * size and net.facts.load_said == "said"
    (plain,) = pn.prompt_networks(prompt, lambda f, n: str(tmp_path / n), lambda k: None)
    assert plain.facts.load_peak_bytes == 0 and plain.facts.load_said is None
