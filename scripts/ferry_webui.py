"""The WebUI side of Ferry (AUTOMATIC1111 / Forge load every scripts/*.py as a WebUI script).

For now it adds the panel as a tab where the host's Gradio can draw it (web/panel/a1111.py);
outside a WebUI importing it does nothing.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path


def _pack_name() -> str:
    path = Path(__file__).resolve().parents[1] / "tools" / "pack_loader.py"
    spec = importlib.util.spec_from_file_location("ferry_pack_loader", path)
    assert spec is not None and spec.loader is not None
    loader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loader)
    return str(loader.load_pack_package())


def _register_tab() -> None:
    try:
        from modules import script_callbacks  # type: ignore[import-not-found]
    except ImportError:
        return
    import gradio

    a1111 = importlib.import_module(_pack_name() + ".web.panel.a1111")
    a1111.register_tab(script_callbacks, gradio.__version__)


_register_tab()
