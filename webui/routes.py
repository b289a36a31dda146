"""``GET /ferry/stats`` in a WebUI: the live offloads and how often they were laid out; and
``GET /ferry/plan``: the accordion's Plan button's text (webui/plan.py) for the loaded
checkpoint, the accordion's values as query parameters (each one's default the accordion's).

The WebUI's own API (``/sdapi/v1/*``) knows nothing of Ferry; this route lets a script or a
test see where the UNet's and the text encoder's weights are without the panel: each live
offload's stats (the same dict the panel's table and ComfyUI's sidebar show), the layouts and
releases so far (a generation with unchanged settings adds none), the settings file, and the
last refusal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..offload_core.tools.monitor import read_offloads
from ..offload_core.tools.settings_file import default_settings_path
from .auto_plan import DEFAULT_CFG, DEFAULT_STEPS
from .controls import CONTROLS, DEFAULTS
from .live_layout import COUNTS
from .plan import plan_answer
from .script import Host


def stats() -> dict[str, Any]:
    return {
        "offloads": [{"name": o.name, **o.stats} for o in read_offloads()],
        "layouts": COUNTS["layouts"],
        "releases": COUNTS["releases"],
        "refusals": COUNTS["refusals"],
        "last_refusal": COUNTS["last_refusal"],
        "settings_path": str(default_settings_path()),
    }


def plan_route(host: Host) -> Callable[..., dict[str, Any]]:
    """``GET /ferry/plan``: ``{"text": ..., "networks": [...]}``, what the Plan button shows
    for these values and Steps and CFG (``networks``: the settings a generation would run per
    network, "auto" resolved by the same plan)."""
    d = DEFAULTS

    def plan(
        enabled: bool = d["enabled"], level: str = d["level"],
        blocks_per_group: str = d["blocks_per_group"], tier: str = d["tier"],
        disk_path: str = d["disk_path"], prefetch_depth: str = d["prefetch_depth"],
        vram_budget: str = d["vram_budget"], use_saved: bool = d["use_saved"],
        text_encoder: bool = d["text_encoder"], steps: int = DEFAULT_STEPS,
        cfg_scale: float = DEFAULT_CFG,
    ) -> dict[str, Any]:  # fmt: skip
        given = locals()
        values = tuple(given[cid] for cid, _ in CONTROLS)
        return plan_answer(
            host.loaded_model(), values, default_disk_path=host.default_disk_path,
            load_saved=host.load_saved, steps=steps, cfg_scale=cfg_scale,
        )  # fmt: skip

    return plan


def add_routes(_demo: Any, app: Any, host: Host | None = None) -> None:
    """``script_callbacks.on_app_started`` callback (FastAPI ``app``); ``host``: Forge's
    parts, for the plan route (entry.py binds it)."""
    app.add_api_route("/ferry/stats", stats, methods=["GET"])
    if host is not None:
        app.add_api_route("/ferry/plan", plan_route(host), methods=["GET"])
