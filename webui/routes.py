"""``GET /ferry/stats`` in a WebUI: the live offloads and how often they were laid out.

The WebUI's own API (``/sdapi/v1/*``) knows nothing of Ferry; this route lets a script or a
test see where the UNet's and the text encoder's weights are without the panel: each live
offload's stats (the same dict the panel's table and ComfyUI's sidebar show), the layouts and
releases so far (a generation with unchanged settings adds none), the settings file, and the
last refusal.
"""

from __future__ import annotations

from typing import Any

from ..offload_core.tools.monitor import read_offloads
from ..offload_core.tools.settings_file import default_settings_path
from .layout import COUNTS


def stats() -> dict[str, Any]:
    return {
        "offloads": [{"name": o.name, **o.stats} for o in read_offloads()],
        "layouts": COUNTS["layouts"],
        "releases": COUNTS["releases"],
        "refusals": COUNTS["refusals"],
        "last_refusal": COUNTS["last_refusal"],
        "settings_path": str(default_settings_path()),
    }


def add_routes(_demo: Any, app: Any) -> None:
    """``script_callbacks.on_app_started`` callback (FastAPI ``app``)."""
    app.add_api_route("/ferry/stats", stats, methods=["GET"])
