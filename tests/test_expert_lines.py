"""Two networks of one class in one prompt (Wan 2.2's two experts, both "model: WanModel")
each show their own planner's sentence and their own disk reads: in the sidebar's payload
(nodes/ui/stats.py), the memory report (nodes/ui/report.py) and the panel's monitor rows.
Both travel with each network's offload (the node's ComfyOffload, its layout's handle), not
in a table keyed by the line's title. Real offloads, laid out through the seam as Ferry
Offload Model lays them out (one name, the class's, for both)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from tests.conftest import PACK_NAME, load_pack
from tests.test_offload_lines import Base

load_pack()
oc = importlib.import_module(f"{PACK_NAME}.offload_core")
config = importlib.import_module(f"{PACK_NAME}.nodes.planning.config")
binding_mod = importlib.import_module(f"{PACK_NAME}.nodes.patcher.live_layout")
stats = importlib.import_module(f"{PACK_NAME}.nodes.ui.stats")
report = importlib.import_module(f"{PACK_NAME}.nodes.ui.report")
prompt_reads = importlib.import_module(f"{PACK_NAME}.nodes.ui.prompt_reads")
monitor = importlib.import_module(f"{PACK_NAME}.offload_core.tools.monitor")
demo = importlib.import_module(f"{PACK_NAME}.offload_core.model.demo")

NAME = "DemoDiT"  # what Ferry Offload Model names both: the class, as core names it
WHY = {"high": "disk: the high-noise expert's sentence", "low": "disk: the low-noise one's"}


def expert_offload(folder: str, why: str) -> Any:
    policy = config.policy_from_inputs(
        level="block", blocks_per_group=1, tier="disk", disk_path=folder, prefetch_depth=1,
        vram_budget="",
    )  # fmt: skip
    return config.ComfyOffload(policy, name=NAME, why=why)


@dataclass
class Expert:
    layout: Any
    offload: Any
    net: Any
    inputs: dict[str, Any]
    ref: torch.Tensor

    def run(self) -> None:
        with torch.inference_mode():
            assert torch.equal(self.net(**self.inputs), self.ref)  # offloaded == resident


@pytest.fixture
def experts(tmp_path: Any) -> Iterator[dict[str, Expert]]:
    out = {}
    for seed, which in enumerate(("high", "low")):
        net = demo.build_demo_model(size_gb=0.002, dtype=torch.float32, seed=seed)
        x = demo.demo_inputs(net, tokens=8)
        with torch.inference_mode():
            ref = net(**x)
        layout = binding_mod.ComfyLayout.of(Base(net), net)
        offload = expert_offload(str(tmp_path / which), WHY[which])
        assert layout.ensure(offload, "cpu", None, lambda: None)
        out[which] = Expert(layout, offload, net, x, ref)
    prompt_reads.reset()
    try:
        yield out
    finally:
        for e in out.values():
            e.layout.release()
        prompt_reads.reset()
    assert oc.live_offloads() == []


def _lines(samples: list[Any]) -> tuple[list[dict[str, Any]], str]:
    entries = [stats.offload_entry(o) for o in samples]
    text = report.report_text(oc.process_memory(), None, None, [o.stats for o in samples])
    return entries, text


def test_each_expert_shows_its_own_sentence_and_disk_reads(experts: dict[str, Expert]) -> None:
    high, low = experts["high"], experts["low"]
    high.run()  # read before the prompt: not this prompt's
    stats.observe_prompt("p1", monitor.read_offloads())
    before = [e.layout.handle.stats().bytes_disk for e in (high, low)]
    high.run()  # one pass of the high-noise expert, two of the low-noise one
    low.run()
    low.run()
    read = [e.layout.handle.stats().bytes_disk - b for e, b in zip((high, low), before)]
    assert 0 < read[0] < read[1]
    entries, text = _lines(monitor.read_offloads())
    assert [e["title"] for e in entries] == [f"model: {NAME}", f"model: {NAME}-2"]
    assert [e["why"] for e in entries] == [WHY["high"], WHY["low"]]
    assert [e["disk_read_last_prompt"] for e in entries] == read
    report_whys = [line.strip() for line in text.splitlines() if line.startswith("  why: ")]
    assert report_whys == [f"why: {WHY['high']}", f"why: {WHY['low']}"]
    reads = [line.strip() for line in text.splitlines() if "this prompt" in line]
    assert reads == [f"read from disk this prompt: {oc.units.fmt_bytes(n)}" for n in read]


def test_panel_rows_say_each_experts_sentence(experts: dict[str, Expert]) -> None:
    pytest.importorskip("gradio")
    view = importlib.import_module(f"{PACK_NAME}.web.panel.monitor_view")
    rows = view.offload_rows(monitor.Snapshot([], monitor.read_offloads()))
    why = view.OFFLOAD_COLUMNS.index("why")
    assert [(r[0], r[why]) for r in rows] == [
        (f"model: {NAME}", WHY["high"]),
        (f"model: {NAME}-2", WHY["low"]),
    ]


def test_an_expert_laid_out_again_counts_from_zero(experts: dict[str, Expert]) -> None:
    # The high-noise expert is let go and laid out again during the prompt (core unloaded it
    # to make room): its new layout takes back the name, and reads from disk anew.
    high = experts["high"]
    high.run()
    stats.observe_prompt("p1", monitor.read_offloads())  # its old layout read one pass
    high.layout.release()
    assert high.layout.ensure(high.offload, "cpu", None, lambda: None)
    high.run()
    entry = next(stats.offload_entry(o) for o in monitor.read_offloads() if o.name == NAME)
    assert entry["disk_read_last_prompt"] == high.layout.handle.stats().bytes_disk > 0
    assert entry["why"] == WHY["high"]


def test_a_kept_layout_takes_the_new_prompts_sentence(experts: dict[str, Expert]) -> None:
    from dataclasses import replace

    low = experts["low"]
    handle = low.layout.handle
    again = replace(low.offload, why="disk: the next prompt's sentence")
    assert not low.layout.ensure(again, "cpu", None, lambda: None)  # same settings: kept
    assert low.layout.handle is handle
    assert handle.stats().why == "disk: the next prompt's sentence"
