"""The offload node's widget values -> a validated OffloadPolicy, every error naming a widget.

Pure logic (no ComfyUI import), so CI tests it directly. The node only calls these.
A ConfigError from offload_core names a *setting* ("vram_budget_gb"); a user sees *widgets*
("vram_budget"), so each error is re-raised as NodeInputError naming the widget to change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...offload_core import ConfigError, DiskTier, OffloadPolicy
from ...offload_core.control_defaults import CONTROL_DEFAULTS, PLANNED_SETTINGS
from ...offload_core.disk import folder as disk_folder
from ...offload_core.planner import Choice, Wish
from ...offload_core.policy import (
    AUTO,
    DEFAULT_HEADROOM_GB,
    LEVEL_NAMES,
    TIER_NAMES,
    parse_blocks_per_group,
    parse_disk_path,
    parse_prefetch_depth,
)
from ...seam.offload import HeldOffload
from ..input_error import NodeInputError, as_node_error

# Widget ids of "Ferry Offload Model". Stable forever: saved workflows refer to them.
LEVELS = LEVEL_NAMES
TIERS = TIER_NAMES
#: The tier widget's choices: "auto" (the planner's, the default) first, then the tiers.
TIER_CHOICES = (AUTO, *TIER_NAMES)
#: The widgets "auto" may stand in, each one's planner field.
AUTO_WIDGETS = PLANNED_SETTINGS
# The optional widgets' defaults are the policy's (offload_core/control_defaults.py:
# offload_inputs.py and policy_from_inputs read them there), so a default is written once.


def policy_from_inputs(
    *,
    level: str,
    blocks_per_group: int,
    tier: str,
    disk_path: str,
    prefetch_depth: int,
    vram_budget: str,
    default_disk_path: str | None = None,
    headroom_gb: float = DEFAULT_HEADROOM_GB,
    direct_io: bool = DiskTier.direct_io,
    verify: str = DiskTier.verify,
    cpu_read: str = DiskTier.cpu_read,
    bake_lora: str = CONTROL_DEFAULTS["bake_lora"],
) -> OffloadPolicy:
    """The policy the widgets describe, validated. Raises NodeInputError naming a widget.

    The raw widget values go to ``OffloadPolicy.from_dict``, which runs each setting's one
    parser (the panel and the settings file use the same ones).
    """
    disk = tier == "disk"
    try:
        # The setting's one parser: empty is this host's default folder.
        path = parse_disk_path(disk_path, default_disk_path) if disk else None
        return OffloadPolicy.from_dict(
            {
                "level": level,
                "blocks_per_group": blocks_per_group,
                "tier": tier,
                "disk_path": path,
                "direct_io": direct_io if disk else None,
                "verify": verify if disk else None,
                "cpu_read": cpu_read if disk else None,
                "prefetch_depth": prefetch_depth,
                "vram_budget_gb": vram_budget,
                "headroom_gb": headroom_gb,
                "bake_lora": bake_lora,
            }
        )
    except ConfigError as e:
        raise as_node_error(e) from None


def is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == AUTO


def wish_from_widgets(widgets: dict[str, Any]) -> Wish:
    """What a Ferry node's tier, blocks_per_group and prefetch_depth widgets ask of the
    planner: None where "auto". A bad value raises NodeInputError naming the widget."""
    tier = widgets.get("tier", AUTO)
    if not is_auto(tier) and tier not in TIER_NAMES:
        raise NodeInputError("tier", f"must be one of {list(TIER_CHOICES)}, got {tier!r}")
    try:
        blocks, depth = (widgets.get(k, AUTO) for k in ("blocks_per_group", "prefetch_depth"))
        return Wish(
            tier=None if is_auto(tier) else tier,
            blocks_per_group=None if is_auto(blocks) else parse_blocks_per_group(blocks),
            prefetch_depth=None if is_auto(depth) else parse_prefetch_depth(depth),
        )
    except ConfigError as e:
        raise as_node_error(e) from None


def resolve_widgets(widgets: dict[str, Any], choice: Choice) -> dict[str, Any]:
    """The widgets with each "auto" replaced by the planner's ``choice``."""
    chosen = {
        "tier": choice.tier,
        "blocks_per_group": choice.blocks_per_group,
        "prefetch_depth": choice.prefetch_depth,
    }
    return {k: chosen[k] if k in chosen and is_auto(v) else v for k, v in widgets.items()}


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
