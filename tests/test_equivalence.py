"""Offloaded output equals resident output exactly, in every level x tier x dtype x kind of
weight, and remove() gives back the same parameters with the same bytes."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from offload_core import (
    BlockLevel,
    DiskTier,
    LeafLevel,
    OffloadPolicy,
    PinnedRamTier,
    RamTier,
    apply_offload,
)
from offload_core.runtime.group import FORMS_KEPT
from tests.helpers import make_model, make_uneven_model, reference, snapshot, state_equal

LEVELS = {"block1": BlockLevel(1), "block2": BlockLevel(2), "leaf": LeafLevel()}


@pytest.mark.parametrize("quant", ["plain", "int8", "float8"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("tier", ["pinned", "ram", "disk", "disk-copy"])
@pytest.mark.parametrize("level", ["block1", "leaf"])
def test_offloaded_equals_resident(tmp_path, level, tier, dtype, quant):
    """``disk`` on a CPU computes from the group files' mapping (DiskTier(cpu_read="mapped"));
    ``disk-copy`` reads them into slots (cpu_read="copy", the path a GPU takes); the default,
    "auto", picks one of the two (tests/test_mapped.py: test_cpu_read_rule)."""
    x, ref = reference(dtype, quant)
    model = make_model(dtype, quant)
    if quant != "plain":
        assert any(is_traceable_wrapper_subclass(p) for p in model.parameters())
    before, ids, kinds = snapshot(model)
    tiers = {
        "pinned": PinnedRamTier(),
        "ram": RamTier(),
        "disk": DiskTier(str(tmp_path), cpu_read="mapped"),
        "disk-copy": DiskTier(str(tmp_path), cpu_read="copy"),
    }
    handle = apply_offload(
        model, OffloadPolicy(level=LEVELS[level], tier=tiers[tier]), onload_device="cpu"
    )
    with torch.no_grad():
        outs = [model(**x) for _ in range(3)]
    stats = handle.stats()
    handle.remove()
    for out in outs:
        assert torch.equal(out, ref)
    assert stats.forwards == 3 and stats.group_loads >= 3 * stats.groups
    moved = stats.bytes_disk if tier.startswith("disk") else stats.bytes_h2d
    assert moved >= 3 * sum(g.nbytes for g in handle.plan.streamed) * 0.99
    after, ids_after, kinds_after = snapshot(model)
    assert ids_after == ids, "parameters must stay the same objects"
    assert kinds_after == kinds
    assert state_equal(before, after)
    if tier.startswith("disk"):
        assert list(tmp_path.iterdir()) == [], "remove() deletes what Ferry wrote"


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_block_groups_and_prefetch_depths(tmp_path, depth):
    x, ref = reference("bf16")
    model = make_model("bf16")
    handle = apply_offload(
        model,
        OffloadPolicy(level=BlockLevel(2), tier=DiskTier(str(tmp_path)), prefetch_depth=depth),
        onload_device="cpu",
    )
    with torch.no_grad():
        outs = [model(**x) for _ in range(3)]
    st = handle.stats()
    handle.remove()
    assert all(torch.equal(o, ref) for o in outs)
    # After the first forward the order is known: nothing is loaded on demand.
    assert st.on_demand_loads <= 1


def test_leaf_order_is_traced_then_predicted():
    x, _ref = reference("fp32")
    model = make_model("fp32")
    handle = apply_offload(
        model, OffloadPolicy(level=LeafLevel(), tier=RamTier()), onload_device="cpu"
    )
    with torch.no_grad():
        model(**x)
        first = handle.stats().on_demand_loads
        model(**x)
        model(**x)
    st = handle.stats()
    handle.remove()
    # The first guess is registration order, and the demo model runs leaves in another one
    # (time_in before img_in, both streams' qkv before either proj): the traced forward has
    # loads nothing predicted, and the counter must have seen them.
    assert first > 0, "the traced forward loaded groups out of registration order"
    assert st.on_demand_loads == first, "after the traced forward every load is predicted"


class Reordered(nn.Module):
    """Four equal Linear leaves run in ``self.order`` (registration order until a test changes
    it): which loads are predicted can be written down from the order alone."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(11)
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))
        self.order = [0, 1, 2, 3]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in self.order:
            x = torch.tanh(self.layers[i](x))
        return x


def test_on_demand_loads_count_each_unpredicted_load():
    """A load is predicted when its group follows the previous one in the traced order (the
    first group follows the last, as the window wraps into the next forward); every other
    load is started on demand and counted once."""
    model = Reordered().requires_grad_(False)
    x = torch.randn(2, 16, generator=torch.Generator().manual_seed(12))
    handle = apply_offload(
        model, OffloadPolicy(level=LeafLevel(), tier=RamTier()), onload_device="cpu"
    )
    loads = []
    with torch.no_grad():
        for order in ([0, 1, 2, 3], [0, 1, 2, 3], [0, 2, 1, 3], [0, 2, 1, 3], [3, 2, 1, 0]):
            model.order = order
            model(x)
            loads.append(handle.stats().on_demand_loads)
    handle.remove()
    # Registration order is the first guess: nothing unpredicted. [0, 2, 1, 3] against the
    # traced [0, 1, 2, 3]: 2 (after 0, 1 was next), 1 (after 2, 3 was next) and 3 (after 1, 2
    # was next) are not; then it is the traced order. [3, 2, 1, 0] against [0, 2, 1, 3]: 3
    # (the window wrapped to 0), 2 (after 3, 0 was next) and 0 (after 1, 3 was next) are not;
    # 1 follows 2 in the traced order.
    assert loads == [0, 0, 3, 3, 3 + 3]


@pytest.mark.parametrize("tier", ["ram", "pinned", "disk", "disk-copy"])
@pytest.mark.parametrize("depth", [1, 2])
def test_uneven_leaf_groups_prefetched_by_bytes(tmp_path, tier, depth):
    """Leaf groups from 512 bytes to 1 MiB share the ring: exact output, every load after the
    traced forward predicted, more groups in flight than the depth."""
    model, x = make_uneven_model()
    with torch.no_grad():
        ref = model(**x)
    tiers = {
        "pinned": PinnedRamTier(),
        "ram": RamTier(),
        "disk": DiskTier(str(tmp_path), cpu_read="mapped"),
        "disk-copy": DiskTier(str(tmp_path), cpu_read="copy"),
    }
    policy = OffloadPolicy(level=LeafLevel(), tier=tiers[tier], prefetch_depth=depth)
    handle = apply_offload(model, policy, onload_device="cpu")
    engine = handle._engine
    assert engine is not None
    widest = [0]
    real_top_up = engine.schedule.top_up

    def top_up():
        planned = real_top_up()
        widest[0] = max(widest[0], len(engine.schedule.window))
        return planned

    engine.schedule.top_up = top_up  # type: ignore[method-assign]
    with torch.no_grad():
        outs = [model(**x) for _ in range(4)]
    st = handle.stats()
    forms = [len(e.slot_forms) for g in engine.groups for e in g.spec.entries]
    handle.remove()
    assert all(torch.equal(o, ref) for o in outs)
    assert st.on_demand_loads == 0 and widest[0] > depth
    if tier != "disk":  # a mapped group computes in place: no slot, no device form
        assert 0 < max(forms) <= FORMS_KEPT, "device forms are cached by region, boundedly"
