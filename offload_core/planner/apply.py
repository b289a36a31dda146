"""The planner's choice applied to a policy as a typed value: a host builds the policy from
what its user set (every setting on "auto" left at OffloadPolicy's own default) and hands it
here with the choice; nothing is turned back into the text a user would type."""

from __future__ import annotations

from dataclasses import replace

from ..errors import ConfigError
from ..policy import (
    ASK_FOR_FOLDER,
    AUTO,
    BlockLevel,
    DiskTier,
    OffloadPolicy,
    PinnedRamTier,
    RamTier,
    SharedRamTier,
    Tier,
    TierName,
)
from .choose import Choice


def with_choice(
    policy: OffloadPolicy, choice: Choice, disk: DiskTier | None = None
) -> OffloadPolicy:
    """``policy`` with the planner's ``choice`` in each setting its network left on auto
    (``choice.network.wish``'s None fields): the tier (a disk choice lays out in ``disk``, the
    host's folder and options, where ``policy``'s tier is not disk already), blocks per group
    (block level), the look-ahead; and, where vram_budget is "auto", the VRAM the planner gave
    it (``planned_vram``: its resident share, ``Choice.vram_resident``, and its streaming
    slots). What the user set stays as it is."""
    wish = choice.network.wish
    tier, level, depth = policy.tier, policy.level, policy.prefetch_depth
    if wish.tier is None and choice.tier != policy.tier_name:
        tier = _tier_named(choice.tier, disk)
    if wish.blocks_per_group is None and isinstance(level, BlockLevel):
        level = BlockLevel(choice.blocks_per_group)
    if wish.prefetch_depth is None:
        depth = choice.prefetch_depth
    planned = policy.planned_vram
    if policy.vram_budget == AUTO:
        planned = choice.vram_resident + choice.sizing.slot_bytes
    out = replace(policy, tier=tier, level=level, prefetch_depth=depth, planned_vram=planned)
    out.validate()
    return out


def _tier_named(name: TierName, disk: DiskTier | None) -> Tier:
    """The tier object of a planner's tier name; a disk one is the host's ``disk``."""
    if name == "pinned":
        return PinnedRamTier()
    if name == "ram":
        return RamTier()
    if name == "shared":
        return SharedRamTier()
    if disk is None:
        raise ConfigError("disk_path", f"the planner chose the disk tier; {ASK_FOR_FOLDER}")
    return disk
