"""The planner's choice applied to a policy as a typed value (planner/apply.py with_choice): only
what the network left on auto changes, and the VRAM share it was given reaches the layout."""

from __future__ import annotations

import importlib

import pytest
from torch import nn

from offload_core import BlockLevel, DiskTier, LeafLevel, OffloadPolicy, RamTier, plan_offload
from offload_core.errors import ConfigError
from offload_core.planner import MachineFacts, NetworkFacts, Wish, plan_graph, with_choice
from offload_core.policy import AUTO, PinnedRamTier
from offload_core.units import GIB
from tests.conftest import PACK_NAME, load_pack

load_pack()
# The seam is the pack's (relative imports): its own policy class goes with it.
resolve_auto = importlib.import_module(f"{PACK_NAME}.seam.live_layout").resolve_auto
PackPolicy = importlib.import_module(f"{PACK_NAME}.offload_core.policy").OffloadPolicy
pack_with_choice = importlib.import_module(f"{PACK_NAME}.offload_core.planner").with_choice


def _choice(wish: Wish, vram_gib: float = 8, ram_gib: float = 64):  # type: ignore[no-untyped-def]
    n = 12 * GIB
    net = NetworkFacts("flux", "model", n, (n // 57,) * 57, reads_per_prompt=20, wish=wish)
    machine = MachineFacts(
        vram_free=int(vram_gib * GIB), ram_available=int(ram_gib * GIB), pin_limit=None,
        disk_free=500 * GIB, disk_folder="/nvme/ferry",
    )  # fmt: skip
    return plan_graph(machine, [net]).check().choices[0]


def test_every_auto_setting_takes_the_choice() -> None:
    choice = _choice(Wish())
    policy = with_choice(OffloadPolicy(vram_budget=AUTO), choice, DiskTier("/nvme/ferry"))
    assert policy.tier_name == choice.tier
    assert policy.level == BlockLevel(choice.blocks_per_group)
    assert policy.prefetch_depth == choice.prefetch_depth
    assert policy.planned_vram == choice.vram_resident + choice.sizing.slot_bytes
    assert choice.vram_resident > 0  # the share carried is the planner's, not zero


def test_what_the_user_set_stays() -> None:
    choice = _choice(Wish(tier="ram", blocks_per_group=3, prefetch_depth=2))
    base = OffloadPolicy(level=BlockLevel(3), tier=RamTier(), prefetch_depth=2, vram_budget=None)
    policy = with_choice(base, choice)
    assert policy == base  # nothing was auto; a fixed VRAM budget is the user's too
    assert policy.planned_vram is None


def test_a_disk_choice_lays_out_in_the_hosts_folder() -> None:
    choice = _choice(Wish(tier="disk"))  # the user's tier, the planner's groups
    disk = DiskTier("/nvme/ferry", direct_io=False)
    assert with_choice(OffloadPolicy(tier=disk), choice).tier is disk
    auto = _choice(Wish(), ram_gib=4)  # too little RAM: the planner picks disk
    assert auto.tier == "disk"
    assert with_choice(OffloadPolicy(), auto, disk).tier is disk
    with pytest.raises(ConfigError) as e:
        with_choice(OffloadPolicy(), auto)
    assert e.value.setting == "disk_path"


def test_leaf_level_keeps_its_leaves_and_pinned_keeps_its_limit() -> None:
    choice = _choice(Wish())
    assert choice.tier == "pinned"
    base = OffloadPolicy(level=LeafLevel(), tier=PinnedRamTier(pin_limit=GIB))
    policy = with_choice(base, choice)
    assert policy.level == LeafLevel()
    assert policy.tier == PinnedRamTier(pin_limit=GIB)


def test_the_planned_share_is_not_what_the_policy_is() -> None:
    # A later plan whose VRAM figure moved must not make a kept layout a new one.
    a = with_choice(OffloadPolicy(vram_budget=AUTO), _choice(Wish(), vram_gib=8))
    b = with_choice(OffloadPolicy(vram_budget=AUTO), _choice(Wish(), vram_gib=9))
    assert a.planned_vram != b.planned_vram
    assert a == b and hash(a) == hash(b)


def test_the_layout_keeps_the_planned_share_capped_by_what_is_free() -> None:
    planned = pack_with_choice(PackPolicy(vram_budget=AUTO, headroom_bytes=0), _choice(Wish()))
    share = planned.planned_vram
    assert share is not None
    assert resolve_auto(planned, 100 * GIB, 0).vram_budget == share  # not recomputed
    assert resolve_auto(planned, share // 2, 0).vram_budget == share // 2  # less is free now
    unplanned = PackPolicy(vram_budget=AUTO, headroom_bytes=0)
    assert resolve_auto(unplanned, 100 * GIB, 0).vram_budget == 100 * GIB


def test_a_cpu_layout_ignores_a_planned_share() -> None:
    # On a CPU "auto" keeps nothing on the onload device (model/plan.py), planned or not.
    model = nn.Sequential(*(nn.Linear(8, 8) for _ in range(4)))
    policy = OffloadPolicy(level=LeafLevel(), vram_budget=AUTO, planned_vram=10**9)
    plan = plan_offload(model, policy, onload_device="cpu")
    assert plan.budget_bytes is None
