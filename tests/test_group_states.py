"""The group strip the UIs draw (offload_core/runtime/group_states.py): read from a real
offloaded model's engine during its forward, each block's group is on the device while it
computes, the groups kept on the device say so, and the rest wait; the strip moves along the
forward, and reaches the sidebar's payload (nodes/ui/stats.py)."""

from __future__ import annotations

import importlib
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from offload_core import BlockLevel, DiskTier, OffloadPolicy, RamTier, apply_offload, plan_offload
from offload_core.model.demo import build_demo_model, demo_inputs
from offload_core.runtime.engine import Load
from offload_core.runtime.group_states import GroupState, strip
from offload_core.runtime.schedule import Planned
from tests.conftest import PACK_NAME, load_pack


def _model() -> tuple[nn.Module, dict[str, torch.Tensor], torch.Tensor]:
    model = build_demo_model(0.003, torch.float32, seed=3)
    x = demo_inputs(model, tokens=8)
    with torch.inference_mode():
        ref = model(**x)
    return model, x, ref


def _blocks(model: nn.Module) -> list[nn.Module]:
    return [*model.double_blocks, *model.single_blocks]


def _policy(model: nn.Module, tier: object) -> OffloadPolicy:
    """One block a group, one ahead, and a budget that keeps two groups on the device."""
    base = plan_offload(model, OffloadPolicy(level=BlockLevel(1), tier=tier), onload_device="cpu")
    budget = base.outside_bytes + 2 * base.slot_bytes + 2 * base.slot_bytes + base.slot_bytes // 2
    return OffloadPolicy(level=BlockLevel(1), tier=tier, prefetch_depth=1, vram_budget=budget)


def _strips_during_forward(tier: object) -> tuple[Any, list[str], str, str, bool]:
    """The plan, the strip read as each block starts computing, the strip
    before the first forward and after it, and whether the output equals the resident one."""
    model, x, ref = _model()
    handle = apply_offload(model, _policy(model, tier), onload_device="cpu")
    try:
        resident = [g.resident for g in handle.plan.groups]
        assert len(resident) == len(_blocks(model))  # one group per block, in order
        seen: list[str] = []
        # Registered after the engine's own pre-hooks, so each runs once its group is in.
        hooks = [
            b.register_forward_pre_hook(lambda m, a: seen.append(handle.stats().group_states))
            for b in _blocks(model)
        ]
        before = handle.stats().group_states
        with torch.inference_mode():
            out = model(**x)
        after = handle.stats().group_states
        for h in hooks:
            h.remove()
        return handle.plan, seen, before, after, torch.equal(out, ref)
    finally:
        handle.remove()


@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_each_block_is_on_the_device_while_it_computes(tier: str, tmp_path: Path) -> None:
    t = RamTier() if tier == "ram" else DiskTier(str(tmp_path))
    plan, seen, before, after, equal = _strips_during_forward(t)
    resident = [g.resident for g in plan.groups]
    assert equal
    assert sum(resident) == 2 and not all(resident)
    letters = {s.value for s in GroupState}
    for i, s in enumerate(seen):
        assert len(s) == len(resident) and set(s) <= letters, s
        assert [c == "r" for c in s] == resident, s  # the kept groups, and only they
        assert s[i] in ("r", "d"), (i, s)  # the block computing now is there
        # One ahead, by bytes: what is in or coming fits the ring of two slots.
        live = sum(g.nbytes for g, c in zip(plan.groups, s) if c in "df")
        assert 0 < live <= 2 * plan.slot_bytes, s
        if not resident[i]:
            assert s[i] == "d", (i, s)
            assert "w" in s, s  # the others wait in their tier
    # Nothing was loaded before the first forward; the strip moved with the forward.
    assert before == "".join("r" if r else "w" for r in resident)
    assert len(set(seen)) >= sum(not r for r in resident), seen
    # After it, the next forward's first streamed group is prefetched (on a CPU, at once).
    first = resident.index(False)
    assert after[first] in ("d", "f"), after


class _Event:
    """Stands in for a device event (torch.cuda.Event's query())."""

    complete = False

    def query(self) -> bool:
        return self.complete


def test_a_load_whose_bytes_are_not_in_is_in_flight() -> None:
    model, _, _ = _model()
    handle = apply_offload(model, _policy(model, RamTier()), onload_device="cpu")
    try:
        engine = handle._engine
        group = engine.groups[-1]
        pending: Future[Any] = Future()
        engine.inflight[10_000] = Load(
            Planned(10_000, None, len(engine.groups) - 1), group, None, pending
        )
        assert handle.stats().group_states[-1] == "f"
        # On an accelerator the read's future holds the copy's device event: in flight
        # until the event has completed.
        copy = _Event()
        pending.set_result(copy)
        assert handle.stats().group_states[-1] == "f"
        copy.complete = True
        assert handle.stats().group_states[-1] == "d"
        del engine.inflight[10_000]
        assert handle.stats().group_states[-1] == "w"
    finally:
        handle.remove()
    assert handle.stats().group_states == ""


def test_strip_puts_the_streamed_states_between_the_resident_groups() -> None:
    d, w, f = GroupState.ON_DEVICE, GroupState.WAITING, GroupState.IN_FLIGHT
    assert strip([True, False, False, True, False], [d, f, w]) == "rdfrw"
    assert strip([], []) == ""


def test_the_sidebar_payload_carries_the_strip() -> None:
    # The pack's own copy of offload_core (its registry is the one the monitor reads).
    load_pack()
    oc = importlib.import_module(f"{PACK_NAME}.offload_core")
    stats = importlib.import_module(f"{PACK_NAME}.nodes.ui.stats")
    monitor = importlib.import_module(f"{PACK_NAME}.offload_core.tools.monitor")
    model, x, _ = _model()
    handle = oc.apply_offload(
        model, oc.OffloadPolicy(level=oc.BlockLevel(1), tier=oc.RamTier()), onload_device="cpu",
        name="strip-demo",
    )  # fmt: skip
    try:
        with torch.inference_mode():
            model(**x)
        (entry,) = [
            stats.offload_entry(o) for o in monitor.read_offloads() if o.name == "strip-demo"
        ]
        assert entry["group_states"] == handle.stats().group_states
        assert len(entry["group_states"]) == entry["groups"] and "d" in entry["group_states"]
    finally:
        handle.remove()
