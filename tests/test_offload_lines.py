"""A graph that offloads its diffusion model and its text encoder shows two lines, each saying
what it is (issue 29): the sidebar's payload (nodes/ui/stats.py), the panel's monitor rows
(web/panel/monitor_view.py) and the memory report (nodes/ui/report.py), read from real offloads
laid out through the seam as the two Ferry nodes lay them out (a ComfyOffload with its kind).
The sidebar's rendering of that payload in a browser is tests/test_sidebar_browser.py."""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn

from tests.conftest import PACK_NAME, load_pack
from tests.test_nodes_text_encoder import TOKENS, FluxLikeClip

load_pack()
oc = importlib.import_module(f"{PACK_NAME}.offload_core")
config = importlib.import_module(f"{PACK_NAME}.nodes.planning.config")
binding_mod = importlib.import_module(f"{PACK_NAME}.nodes.patcher.live_layout")
stats = importlib.import_module(f"{PACK_NAME}.nodes.ui.stats")
report = importlib.import_module(f"{PACK_NAME}.nodes.ui.report")
monitor = importlib.import_module(f"{PACK_NAME}.offload_core.tools.monitor")
demo = importlib.import_module(f"{PACK_NAME}.offload_core.model.demo")
units = importlib.import_module(f"{PACK_NAME}.offload_core.units")
passes = importlib.import_module(f"{PACK_NAME}.seam.passes")
OffloadKind = oc.OffloadKind

#: The text encoder's name as Ferry Offload Text Encoder gives it (text_encoder_name: the
#: encoders the CLIP holds, by their names); the model's as Ferry Offload Model gives it.
TE_NAME = "clip_l + t5xxl + gemma2_2b"
MODEL_NAME = "DemoDiT"
#: The planner's sentence for the text encoder (the node's ComfyOffload carries it).
TE_WHY = "disk: the planner's sentence"


def ferry_offload(
    tier: str, name: str, kind: Any, disk_path: str = "", why: str | None = None
) -> Any:
    policy = config.policy_from_inputs(
        level="block", blocks_per_group=1, tier=tier, disk_path=disk_path, prefetch_depth=1,
        vram_budget="",
    )  # fmt: skip
    return config.ComfyOffload(policy, name=name, kind=kind, why=why)


class Base(nn.Module):
    """Stands in for ComfyUI's BaseModel: the binding lives on it, the network is its
    ``diffusion_model``."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.diffusion_model = net


@dataclass
class Graph:
    """Both offloads live, each run as its node's output would be (equal to resident)."""

    model: Any  # the model's binding
    encoder: Any  # the text encoder's binding


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Graph]:
    te = FluxLikeClip()
    te_ref = te.encode(TOKENS)
    passes.mark_passes(te, ("encode",))  # each encode one pass, as the patcher marks core's
    net = demo.build_demo_model(size_gb=0.002, dtype=torch.float32)
    x = demo.demo_inputs(net, tokens=8)
    with torch.inference_mode():
        net_ref = net(**x)
    # The text encoder first, as a graph encodes before it samples.
    enc = binding_mod.ComfyLayout.of(te, te)
    folder = str(tmp_path_factory.mktemp("te"))
    cfg = ferry_offload("disk", TE_NAME, OffloadKind.TEXT_ENCODER, folder, why=TE_WHY)
    assert enc.ensure(cfg, "cpu", None, lambda: None)
    model = binding_mod.ComfyLayout.of(Base(net), net)
    assert model.ensure(
        ferry_offload("ram", MODEL_NAME, OffloadKind.MODEL), "cpu", None, lambda: None
    )
    try:
        for _ in range(2):
            assert all(torch.equal(g, r) for g, r in zip(te.encode(TOKENS), te_ref, strict=True))
            with torch.inference_mode():
                assert torch.equal(net(**x), net_ref)
        yield Graph(model, enc)
    finally:
        model.release()
        enc.release()
    assert oc.live_offloads() == []


def test_each_offload_is_listed_with_its_kind_model_first(graph: Graph) -> None:
    samples = monitor.read_offloads()
    assert [(o.kind, o.name) for o in samples] == [
        (OffloadKind.MODEL, MODEL_NAME),
        (OffloadKind.TEXT_ENCODER, TE_NAME),
    ]
    assert [o.stats["kind"] for o in samples] == ["model", "text_encoder"]
    assert graph.encoder.handle.kind is OffloadKind.TEXT_ENCODER


def test_sidebar_payload_says_what_each_line_is(graph: Graph) -> None:
    payload = stats.stats_payload(None, monitor.read_offloads(), None)
    json.dumps(payload)  # the event and the route send it as JSON
    model, te = payload["offloads"]
    assert (model["kind"], model["title"]) == ("model", f"model: {MODEL_NAME}")
    assert (te["kind"], te["title"]) == ("text_encoder", f"text encoder: {TE_NAME}")
    # Where each one's weights are, as laid out: the model in RAM, the encoder on disk.
    assert set(model["tiers"]) == {"device", "ram"} and set(te["tiers"]) == {"device", "disk"}
    assert te["tiers"]["disk"] == graph.encoder.handle.plan.bytes_per_tier()["disk"] > 0
    # Each encode read every group from disk: a rate, and the time compute waited for it.
    assert te["bytes_moved"] >= te["tiers"]["disk"] and te["disk_gbps"] > 0
    assert te["stall_s"] >= 0 and te["forwards"] == 2 and model["forwards"] == 2


def test_panel_rows_say_what_each_line_is(graph: Graph) -> None:
    pytest.importorskip("gradio")
    view = importlib.import_module(f"{PACK_NAME}.web.panel.monitor_view")
    snap = monitor.Snapshot([], monitor.read_offloads())
    rows = {
        row[0]: dict(zip(view.OFFLOAD_COLUMNS, row, strict=True)) for row in view.offload_rows(snap)
    }
    assert list(rows) == [f"model: {MODEL_NAME}", f"text encoder: {TE_NAME}"]
    te, model = rows[f"text encoder: {TE_NAME}"], rows[f"model: {MODEL_NAME}"]
    te_stats = graph.encoder.handle.stats()
    assert te["tier"] == "disk" and model["tier"] == "ram"
    assert te["on disk GiB"] == round(te_stats.bytes_per_tier["disk"] / units.GIB, 3)
    assert te["disk read GB/s"] == round(te_stats.disk_gbps, 2) and te["waiting s"] >= 0
    assert model["on disk GiB"] == 0 and model["in RAM GiB"] > 0
    # Why, where the planner chose: the same sentence as the sidebar's line.
    assert te["why"] == TE_WHY and model["why"] == ""


def test_memory_report_says_what_each_line_is(graph: Graph) -> None:
    lines = report.report_text(
        oc.process_memory(), None, None, [h.stats().as_dict() for h in oc.live_offloads()]
    ).splitlines()
    heads = [line for line in lines if ": block level" in line]
    assert heads[0].startswith(f"text encoder: {TE_NAME}: block level, tier disk"), heads
    assert heads[1].startswith(f"model: {MODEL_NAME}: block level, tier ram"), heads


def test_a_kind_that_does_not_exist_is_refused_before_anything_moves() -> None:
    net = nn.Sequential(*(nn.Linear(8, 8) for _ in range(3)))
    before = [p.data_ptr() for p in net.parameters()]
    with pytest.raises(oc.ConfigError, match=r"kind: must be one of 'model', 'text_encoder'"):
        oc.apply_offload(net, kind="vae", onload_device="cpu")
    assert oc.find_offload(net) is None and all(h.model is not net for h in oc.live_offloads())
    assert [p.data_ptr() for p in net.parameters()] == before
