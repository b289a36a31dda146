"""Form values (what the panel's widgets hold) <-> PanelSettings. No gradio here.

The widgets hold loose values (a slider gives 2.0, a text box gives "auto" or "6"); they go
as they are to ``OffloadPolicy.from_dict``, whose per-setting parsers are the same ones the
ComfyUI node and the settings file use. Every error is a ConfigError that names the setting,
and the panel shows it next to the Save button.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ...offload_core.control_defaults import CONTROL_DEFAULTS as DEFAULTS
from ...offload_core.policy import OffloadPolicy
from ...offload_core.tools.settings_file import PanelSettings


class Form(NamedTuple):
    """The settings widgets, in the order the panel's events pass them. The disk tier's
    advanced options come last, with defaults, so callers that predate them still work."""

    level: str
    blocks_per_group: Any
    tier: str
    disk_path: str
    prefetch_depth: Any
    vram_budget: str  # "" (stream everything), "auto", or GB
    headroom_gb: Any
    quant_preset: str
    direct_io: bool = DEFAULTS["direct_io"]
    verify: str = DEFAULTS["verify"]
    cpu_read: str = DEFAULTS["cpu_read"]


def settings_from_form(*values: Any) -> PanelSettings:
    """Builds validated settings from the widget values (``Form`` order)."""
    f = Form(*values)
    disk = f.tier == "disk"
    policy = OffloadPolicy.from_dict(
        {
            "level": f.level,
            "blocks_per_group": f.blocks_per_group,
            "tier": f.tier,
            "disk_path": (f.disk_path or "").strip() or None,
            "direct_io": f.direct_io if disk else None,
            "verify": f.verify if disk else None,
            "cpu_read": f.cpu_read if disk else None,
            "prefetch_depth": f.prefetch_depth,
            "vram_budget_gb": f.vram_budget,
            "headroom_gb": f.headroom_gb,
        }
    )
    settings = PanelSettings(policy=policy, quant_preset=f.quant_preset or "none")
    settings.validate()
    return settings


def _shown(gb: float) -> float:
    # The file keeps exact GB (bytes / 2**30); a widget shows 7.3, not 7.299999999068677.
    # Parsing the shown value gives the same bytes back.
    return round(gb, 3)


def form_from_settings(settings: PanelSettings, disk_path_fallback: str = "") -> Form:
    d = settings.policy.to_dict()
    budget = d["vram_budget_gb"]
    return Form(
        level=d["level"],
        blocks_per_group=d["blocks_per_group"],
        tier=d["tier"],
        disk_path=d["disk_path"] or disk_path_fallback,
        prefetch_depth=d["prefetch_depth"],
        vram_budget="" if budget is None else budget if budget == "auto" else str(_shown(budget)),
        headroom_gb=_shown(d["headroom_gb"]),
        quant_preset=settings.quant_preset,
        direct_io=DEFAULTS["direct_io"] if d["direct_io"] is None else d["direct_io"],
        verify=d["verify"] or DEFAULTS["verify"],
        cpu_read=d["cpu_read"] or DEFAULTS["cpu_read"],
    )
