"""The offload node's widget values -> a validated OffloadPolicy, every error naming a widget.

The widgets are parsed once, into ``NodeSettings``: the node's ``execute``, its
``validate_inputs`` and the prompt reader (graph_plan.py) all parse there; the planner's
choice fills what is on "auto" as a typed value (``NodeSettings.policy``).
Pure logic (no ComfyUI import), so CI tests it directly. The node only calls these.
A ConfigError from offload_core names a *setting* ("vram_budget_gb"); a user sees *widgets*
("vram_budget"), so each error is re-raised as NodeInputError naming the widget to change.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from ...offload_core import ConfigError, DiskTier, OffloadPolicy
from ...offload_core.control_defaults import CONTROL_DEFAULTS, PLANNED_SETTINGS
from ...offload_core.disk import folder as disk_folder
from ...offload_core.planner import Choice, Wish, with_choice
from ...offload_core.policy import (
    AUTO,
    LEVEL_NAMES,
    TIER_NAMES,
    BakeMode,
    BlockLevel,
    LeafLevel,
    LevelName,
    RamTier,
    SharedRamTier,
    Tier,
    parse_bake_lora,
    parse_blocks_per_group,
    parse_disk_path,
    parse_headroom,
    parse_prefetch_depth,
    parse_vram_budget,
)
from ...seam.offload import HeldOffload
from ..input_error import NodeInputError, as_node_error

# Widget ids of "Ferry Offload Model". Stable forever: saved workflows refer to them.
LEVELS = LEVEL_NAMES
TIERS = TIER_NAMES
#: The tier widget's choices: "auto" (the planner's, the default) first, then the tiers.
TIER_CHOICES = (AUTO, *TIER_NAMES)
# The optional widgets' defaults are the policy's (offload_core/control_defaults.py:
# offload_inputs.py and NodeSettings read them there), so a default is written once.


def policy_from_inputs(*, default_disk_path: str | None = None, **widgets: Any) -> OffloadPolicy:
    """The policy of widgets that set every setting (none on "auto"), validated; an empty
    disk_path is ``default_disk_path``. Raises NodeInputError naming a widget."""
    return NodeSettings.parse(widgets).policy(None, default_disk_path)


def is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == AUTO


@dataclass(frozen=True)
class NodeSettings:
    """What a Ferry offload node's widgets say. ``wish``: tier, blocks_per_group and
    prefetch_depth (None: "auto", the planner's); the rest are fixed. ``disk_path`` is kept
    as typed (empty: the host's default folder): it is read only where the tier is disk."""

    wish: Wish
    level: LevelName = CONTROL_DEFAULTS["level"]
    disk_path: str = CONTROL_DEFAULTS["disk_path"]
    vram_budget: int | Literal["auto"] | None = CONTROL_DEFAULTS["vram_budget"]
    headroom_bytes: int = parse_headroom(CONTROL_DEFAULTS["headroom_gb"])
    direct_io: Any = CONTROL_DEFAULTS["direct_io"]
    verify: Any = CONTROL_DEFAULTS["verify"]
    cpu_read: Any = CONTROL_DEFAULTS["cpu_read"]
    bake_lora: BakeMode = CONTROL_DEFAULTS["bake_lora"]

    @classmethod
    def parse(cls, widgets: Mapping[str, Any]) -> NodeSettings:
        """The widgets (by id; a missing one takes its default) parsed. Raises
        NodeInputError naming the widget to change."""
        try:
            return cls._parse(widgets)
        except ConfigError as e:
            raise as_node_error(e) from None

    @classmethod
    def _parse(cls, w: Mapping[str, Any]) -> NodeSettings:
        level = w.get("level", cls.level)
        if level not in LEVEL_NAMES:
            raise ConfigError("level", f"must be 'block' or 'leaf', got {level!r}")
        tier = w.get("tier", AUTO)
        if not is_auto(tier) and tier not in TIER_NAMES:
            raise NodeInputError("tier", f"must be one of {list(TIER_CHOICES)}, got {tier!r}")
        blocks, depth = w.get("blocks_per_group", AUTO), w.get("prefetch_depth", AUTO)
        wish = Wish(
            tier=None if is_auto(tier) else tier,
            blocks_per_group=None if is_auto(blocks) else parse_blocks_per_group(blocks),
            prefetch_depth=None if is_auto(depth) else parse_prefetch_depth(depth),
        )
        typed = w.get("disk_path")
        typed = "" if typed is None else typed
        if wish.tier == "disk" and (not isinstance(typed, str) or typed.strip()):
            parse_disk_path(typed)  # empty is the host's default folder, given at policy()
        disk = {k: w.get(k) for k in ("direct_io", "verify", "cpu_read")}  # None: the default
        return cls(
            wish=wish,
            level=level,
            disk_path=typed if isinstance(typed, str) else "",
            vram_budget=parse_vram_budget(w.get("vram_budget", cls.vram_budget)),
            headroom_bytes=parse_headroom(w.get("headroom_gb", CONTROL_DEFAULTS["headroom_gb"])),
            **{k: CONTROL_DEFAULTS[k] if v is None else v for k, v in disk.items()},
            bake_lora=parse_bake_lora(w.get("bake_lora") or cls.bake_lora),
        )

    @property
    def auto(self) -> bool:
        """Whether any setting is left to the planner."""
        return any(getattr(self.wish, k) is None for k in PLANNED_SETTINGS)

    def disk_folder(self, default: str) -> str:
        """The disk folder the planner counts for this node: its disk_path where that is a
        full path, else the host's ``default`` (ComfyUI's temp folder)."""
        path = self.disk_path.strip()
        return path if path and os.path.isabs(os.path.expanduser(path)) else default

    def policy(
        self,
        choice: Choice | None = None,
        default_disk_path: str | None = None,
        vram_cap: int | None = None,
    ) -> OffloadPolicy:
        """The policy these settings run with: ``choice``, the planner's for this node's
        network, fills every setting left on "auto" (offload_core/planner/apply.py
        ``with_choice``); with none, every setting must be set. ``default_disk_path``: the
        folder an empty disk_path means. ``vram_cap``: Ferry's VRAM budget (the settings
        file, the sidebar), which caps what vram_budget "auto" keeps. Raises NodeInputError
        naming the widget to change."""
        if choice is None and self.auto:
            raise NodeInputError("tier", "'auto' needs the planner's choice; none was made")
        try:
            fixed = self._fixed_policy(default_disk_path, vram_cap)
            if choice is None:
                return fixed
            chose_disk = self.wish.tier is None and choice.tier == "disk"
            return with_choice(fixed, choice, self._disk(default_disk_path) if chose_disk else None)
        except ConfigError as e:
            raise as_node_error(e) from None

    def _fixed_policy(self, default_disk_path: str | None, vram_cap: int | None) -> OffloadPolicy:
        """What the user set; a setting on "auto" keeps OffloadPolicy's own default until
        ``with_choice`` replaces it with the planner's (vram_budget "auto": ``vram_cap``
        where there is one)."""
        w = self.wish
        level = BlockLevel(w.blocks_per_group or 1) if self.level == "block" else LeafLevel()
        tier: Tier | None = None
        if w.tier == "disk":
            tier = self._disk(default_disk_path)
        elif w.tier == "ram":
            tier = RamTier()
        elif w.tier == "shared":
            tier = SharedRamTier()
        policy = OffloadPolicy(
            level=level,
            prefetch_depth=w.prefetch_depth or 1,
            vram_budget=vram_cap
            if self.vram_budget == AUTO and vram_cap is not None
            else self.vram_budget,
            headroom_bytes=self.headroom_bytes,
            bake_lora=self.bake_lora,
        )
        policy = policy if tier is None else replace(policy, tier=tier)
        policy.validate()
        return policy

    def _disk(self, default_disk_path: str | None) -> DiskTier:
        disk = DiskTier(
            parse_disk_path(self.disk_path, default_disk_path),
            direct_io=self.direct_io,
            verify=self.verify,
            cpu_read=self.cpu_read,
        )
        disk.validate()
        return disk


def policy_from_panel(load: Callable[[], Any]) -> OffloadPolicy:
    """The policy saved by the Ferry panel (``load`` is settings_file.load_settings)."""
    try:
        return load().policy
    except ConfigError as e:
        raise as_node_error(e, panel=True) from None


def check_disk_folder(path: str, need_bytes: int | None = None) -> Path:
    """Read-only check of the disk tier's folder (creates nothing): the same check, and the
    same words, as the panel's disk-folder field."""
    check = disk_folder.check_disk_folder(path, need_bytes)
    if not check.ok or check.path is None:
        raise NodeInputError("disk_path", check.message)
    return check.path


@dataclass(frozen=True)
class ComfyOffload(HeldOffload):
    """What a Ferry-offloaded MODEL carries through clone() (seam/offload.py)."""

    name: str = "diffusion_model"
