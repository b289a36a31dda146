"""What a host's controls show before anyone sets them: ComfyUI's widgets
(nodes/offload_inputs.py), Forge's accordion (webui/controls.py) and the panel's form
(web/panel/settings_view.py, forms.py) all start from ``CONTROL_DEFAULTS``: the policy's own
defaults (policy.py), named by the controls' ids, so a default changed there changes everywhere
at once. The choices are policy.py's (``TIER_NAMES``, ``VERIFY_MODES``, ``CPU_READS``, ...).
Saved workflows, templates and infotext carry their own values and never read these.

Here, beside the policy, rather than in seam/: the panel and the settings file are
offload_core's own and read it too, and offload_core never imports seam/.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .policy import AUTO, DEFAULT_HEADROOM_GB, BlockLevel, DiskTier, OffloadPolicy

_POLICY = OffloadPolicy()
CONTROL_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        "level": _POLICY.level_name,
        "blocks_per_group": BlockLevel.blocks_per_group,
        "tier": _POLICY.tier_name,
        "disk_path": "",
        "prefetch_depth": _POLICY.prefetch_depth,
        # A control's budget starts on "auto" (keep what fits resident); the policy's own None
        # (stream every group) is what an empty box says.
        "vram_budget": AUTO,
        "headroom_gb": DEFAULT_HEADROOM_GB,
        "direct_io": DiskTier.direct_io,
        "verify": DiskTier.verify,
        "cpu_read": DiskTier.cpu_read,
        "bake_lora": _POLICY.bake_lora,
    }
)
#: The settings the planner chooses where a control says "auto" (offload_core/planner).
PLANNED_SETTINGS = ("tier", "blocks_per_group", "prefetch_depth")


def control_defaults(*, planned: bool) -> dict[str, Any]:
    """Every control's default (``CONTROL_DEFAULTS``); where the host runs the planner
    (``planned``), the planner's settings start on "auto" instead."""
    return {**CONTROL_DEFAULTS, **(dict.fromkeys(PLANNED_SETTINGS, AUTO) if planned else {})}
