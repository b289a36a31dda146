"""The same panel as a tab in AUTOMATIC1111 / Forge (``script_callbacks.on_ui_tabs``).

Feature-detected, because those UIs pin their own, older Gradio (A1111 3.41, Forge 4.40)
and the panel is written for Gradio 6 (gr.Timer, api_visibility, plot options). On an older
Gradio the tab is not added and one line says how to open the standalone panel instead.
Untested against a real A1111/Forge (neither runs here): the tests drive it with a stand-in
``script_callbacks``.
"""

from __future__ import annotations

import sys
from typing import Any

from ...offload_core.tools.monitor import get_monitor
from .context import PanelContext

MIN_GRADIO_MAJOR = 6
TAB_TITLE = "Ferry"
TAB_ID = "ferry_panel"


def gradio_major(version: str) -> int:
    try:
        return int(version.split(".")[0])
    except ValueError:
        return 0


def register_tab(script_callbacks: Any, gradio_version: str) -> bool:
    """Adds the tab when this Gradio can draw it; returns whether it did."""
    if not hasattr(script_callbacks, "on_ui_tabs"):
        return False
    if gradio_major(gradio_version) < MIN_GRADIO_MAJOR:
        print(
            f"Ferry: the panel tab needs Gradio {MIN_GRADIO_MAJOR}+, this UI runs Gradio "
            f"{gradio_version}; start the panel on its own with: python tools/panel.py",
            file=sys.stderr,
        )
        return False

    def on_ui_tabs() -> list[tuple[Any, str, str]]:
        from .app import build_panel

        monitor = get_monitor()
        monitor.start()
        return [(build_panel(PanelContext(monitor=monitor)), TAB_TITLE, TAB_ID)]

    script_callbacks.on_ui_tabs(on_ui_tabs)
    return True
