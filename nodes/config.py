"""The offload node's widget values -> a validated OffloadPolicy, every error naming a widget.

Pure logic (no ComfyUI import), so CI tests it directly. The node only calls these.
A ConfigError from offload_core names a *setting* ("vram_budget_gb"); a user sees *widgets*
("vram_budget"), so each error is re-raised as NodeInputError naming the widget to change.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..offload_core import ConfigError, DiskTier, FerryError, OffloadPolicy
from ..offload_core.runtime.memory import fmt_bytes

# Widget ids of "Ferry Offload Model". Stable forever: saved workflows refer to them.
LEVELS = ("block", "leaf")
TIERS = ("pinned", "ram", "disk")

# offload_core setting name -> the widget a user changes to fix it.
_WIDGET_FOR_SETTING = {
    "level": "level",
    "blocks_per_group": "blocks_per_group",
    "tier": "tier",
    "disk_path": "disk_path",
    "source_checkpoint": "disk_path",
    "prefetch_depth": "prefetch_depth",
    "vram_budget": "vram_budget",
    "vram_budget_gb": "vram_budget",
    "headroom_bytes": "vram_budget",
    "headroom_gb": "vram_budget",
    "quant_preset": "quant_preset",
}


class NodeInputError(FerryError, ValueError):
    """A node input is invalid. ``input_name`` is the widget to change; str() starts with it."""

    def __init__(self, input_name: str, message: str) -> None:
        super().__init__(f"{input_name}: {message}")
        self.input_name = input_name
        self.message = message


def as_node_error(err: ConfigError, *, panel: bool = False) -> NodeInputError:
    """Re-labels an offload_core ConfigError with the widget that fixes it."""
    msg = str(err)
    prefix = f"{err.setting}: "
    if msg.startswith(prefix):
        msg = msg[len(prefix) :]
    if panel:
        # The values came from the panel's settings file, not from a widget on this node.
        return NodeInputError(
            "use_panel_settings",
            f"the Ferry panel's saved setting {err.setting!r} is invalid ({msg}); fix it in "
            "the panel, or turn use_panel_settings off and set the widgets here",
        )
    return NodeInputError(_WIDGET_FOR_SETTING.get(err.setting, err.setting), msg)


def parse_vram_budget(text: Any) -> float | str | None:
    """'auto' | '' / 'none' (stream every group) | a number of GB -> the policy's flat form."""
    raw = str(text if text is not None else "").strip().lower()
    if raw in ("", "none", "off", "0"):
        return None
    if raw == "auto":
        return "auto"
    try:
        gb = float(raw.removesuffix("gb").strip())
    except ValueError:
        raise NodeInputError(
            "vram_budget",
            f"{text!r} is not 'auto', empty, or a number of GB (e.g. 6 or 7.5)",
        ) from None
    if not math.isfinite(gb) or gb <= 0:
        raise NodeInputError("vram_budget", f"must be more than 0 GB, got {text!r}")
    return gb


def policy_from_inputs(
    *,
    level: str,
    blocks_per_group: int,
    tier: str,
    disk_path: str,
    prefetch_depth: int,
    vram_budget: str,
    default_disk_path: str | None = None,
) -> OffloadPolicy:
    """The policy the widgets describe, validated. Raises NodeInputError naming a widget."""
    path = (disk_path or "").strip() or default_disk_path
    flat = {
        "level": level,
        "blocks_per_group": blocks_per_group,
        "tier": tier,
        "disk_path": path if tier == "disk" else None,
        "prefetch_depth": prefetch_depth,
        "vram_budget_gb": parse_vram_budget(vram_budget),
    }
    try:
        return OffloadPolicy.from_dict(flat)
    except ConfigError as e:
        raise as_node_error(e) from None


def policy_from_panel(load: Callable[[], Any]) -> OffloadPolicy:
    """The policy saved by the Ferry panel (``load`` is settings_file.load_settings)."""
    try:
        return load().policy
    except ConfigError as e:
        raise as_node_error(e, panel=True) from None


def check_disk_folder(path: str, need_bytes: int | None = None) -> Path:
    """Read-only check of the disk tier's folder (creates nothing): usable and roomy enough."""
    raw = (path or "").strip()
    if not raw:
        raise NodeInputError("disk_path", "the disk tier needs a folder on a fast disk (SSD/NVMe)")
    try:
        p = Path(raw).expanduser()
        if not p.is_absolute():
            raise NodeInputError(
                "disk_path", f"use a full path (e.g. /mnt/nvme/ferry), not {raw!r}"
            )
        if p.exists() and not p.is_dir():
            raise NodeInputError("disk_path", f"{p} is a file; give a folder")
        anchor = p
        while not anchor.exists() and anchor.parent != anchor:
            anchor = anchor.parent
        if not anchor.is_dir():
            raise NodeInputError("disk_path", f"{anchor} is a file, so {p} cannot be created")
        if not os.access(anchor, os.W_OK | os.X_OK):
            raise NodeInputError("disk_path", f"{anchor} is not writable by this user")
        free = shutil.disk_usage(anchor).free
    except (OSError, ValueError) as e:
        if isinstance(e, NodeInputError):
            raise
        raise NodeInputError("disk_path", f"not a usable folder ({e})") from None
    if need_bytes is not None and free < need_bytes:
        raise NodeInputError(
            "disk_path",
            f"{anchor} has {fmt_bytes(free)} free but the offloaded groups need "
            f"{fmt_bytes(need_bytes)}; choose a folder on a larger disk",
        )
    return p


@dataclass(frozen=True)
class FerryConfig:
    """What a Ferry-offloaded MODEL carries through clone(): how and under which name."""

    policy: OffloadPolicy
    name: str = "diffusion_model"

    def with_source_checkpoint(self, path: str | None) -> FerryConfig:
        """Lets the disk tier read unchanged groups straight from the model's own file."""
        tier = self.policy.tier
        if not isinstance(tier, DiskTier) or not path:
            return self
        return replace(
            self, policy=replace(self.policy, tier=replace(tier, source_checkpoint=path))
        )
