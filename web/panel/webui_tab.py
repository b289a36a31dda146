"""The same panel as a tab in a WebUI (``script_callbacks.on_ui_tabs``): Forge, A1111, reForge.

They pin their own Gradio: Forge 4.40, A1111 and reForge 3.41. The panel runs on 4.40 and on
6 (compat.py); below 4.40 (no gr.Timer) the tab says, once in the console and in the tab
itself, what is not supported there and what to use instead, and nothing else of Ferry runs.
"""

from __future__ import annotations

import sys
from typing import Any

from ...offload_core.tools.monitor import get_monitor
from .compat import MIN_GRADIO, supported
from .context import PanelContext

TAB_TITLE = "Ferry"
TAB_ID = "ferry_panel"
_said: set[str] = set()


def unsupported_message(gradio_version: str) -> str:
    need = ".".join(map(str, MIN_GRADIO))
    return (
        f"Ferry: this WebUI runs Gradio {gradio_version}; Ferry's panel needs Gradio {need} or "
        "newer and its offload needs Stable Diffusion WebUI Forge, so Ferry does nothing here "
        "(the WebUI is not changed). Use Ferry in Forge or in ComfyUI, or start the panel on "
        "its own from the extension's folder: python tools/panel.py"
    )


def say_once(message: str) -> None:
    """One console line per process, however often the WebUI reloads its scripts."""
    if message not in _said:
        _said.add(message)
        print(message, file=sys.stderr)


def register_tab(script_callbacks: Any, gradio_version: str, **context_options: Any) -> bool:
    """Adds the Ferry tab; returns whether it is the panel (False: the unsupported notice).

    context_options: PanelContext keywords from the host (Forge: its model and Apply)."""
    if not hasattr(script_callbacks, "on_ui_tabs"):
        return False
    if not supported(gradio_version):
        message = unsupported_message(gradio_version)
        say_once(message)

        def notice_tab() -> list[tuple[Any, str, str]]:
            import gradio as gr  # the host's, whatever its version: Blocks and Markdown exist

            with gr.Blocks(analytics_enabled=False) as notice:
                gr.Markdown(message, elem_id="ferry-unsupported")
            return [(notice, TAB_TITLE, TAB_ID)]

        script_callbacks.on_ui_tabs(notice_tab)
        return False

    def on_ui_tabs() -> list[tuple[Any, str, str]]:
        from .app import build_panel

        monitor = get_monitor()
        monitor.start()
        ctx = PanelContext(monitor=monitor, **context_options)
        return [(build_panel(ctx), TAB_TITLE, TAB_ID)]

    script_callbacks.on_ui_tabs(on_ui_tabs)
    return True
