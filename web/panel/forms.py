"""Form values (what the panel's widgets hold) <-> PanelSettings. No gradio here.

The widgets hold loose values (a slider gives 2.0, a text box gives "auto" or "6"), so this
is the one place that turns them into a validated policy; every error is a ConfigError that
names the setting, and the panel shows it next to the Save button.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ...offload_core.errors import ConfigError
from ...offload_core.policy import GIB, OffloadPolicy
from ...offload_core.tools.settings_file import PanelSettings


class Form(NamedTuple):
    """The settings widgets, in the order the panel's events pass them."""

    level: str
    blocks_per_group: Any
    tier: str
    disk_path: str
    prefetch_depth: Any
    vram_budget: str  # "" (no budget), "auto", or GB
    headroom_gb: Any
    quant_preset: str


def _whole(setting: str, v: Any) -> Any:
    # Sliders and number boxes deliver floats; 2.0 means 2, 2.5 stays wrong (validated below).
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return v


def _budget(text: Any) -> Any:
    if text is None:
        return None
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    t = str(text).strip().lower()
    if t in ("", "none", "off"):
        return None
    if t == "auto":
        return "auto"
    try:
        return float(t.removesuffix("gb").strip())
    except ValueError:
        raise ConfigError(
            "vram_budget_gb", f"type a number of GB, 'auto', or leave it empty; got {text!r}"
        ) from None


def settings_from_form(*values: Any) -> PanelSettings:
    """Builds validated settings from the widget values (``Form`` order)."""
    f = Form(*values)
    headroom = _whole("headroom_gb", f.headroom_gb)
    if headroom is None or headroom == "":
        headroom = 2.0
    policy = OffloadPolicy.from_dict(
        {
            "level": f.level,
            "blocks_per_group": _whole("blocks_per_group", f.blocks_per_group),
            "tier": f.tier,
            "disk_path": (f.disk_path or "").strip() or None,
            "prefetch_depth": _whole("prefetch_depth", f.prefetch_depth),
            "vram_budget_gb": _budget(f.vram_budget),
            "headroom_gb": headroom,
        }
    )
    settings = PanelSettings(policy=policy, quant_preset=f.quant_preset or "none")
    settings.validate()
    return settings


def form_from_settings(settings: PanelSettings, disk_path_fallback: str = "") -> Form:
    d = settings.policy.to_dict()
    budget = d["vram_budget_gb"]
    return Form(
        level=d["level"],
        blocks_per_group=d["blocks_per_group"],
        tier=d["tier"],
        disk_path=d["disk_path"] or disk_path_fallback,
        prefetch_depth=d["prefetch_depth"],
        vram_budget="" if budget is None else str(budget),
        headroom_gb=d["headroom_gb"],
        quant_preset=settings.quant_preset,
    )


def gb(n: int | None) -> float | None:
    return None if n is None else n / GIB
