"""Starts the real panel (a real Gradio server) for a test module and stops it after."""

from __future__ import annotations

import importlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

DEMO_GB = 0.002  # 2 double + 4 single blocks: forwards take milliseconds


@dataclass
class RunningPanel:
    url: str
    settings_path: Path
    panel: ModuleType  # <pack>.web.panel
    ctx: Any
    pack: ModuleType

    def sub(self, name: str) -> ModuleType:
        return importlib.import_module(f"{self.pack.__name__}.{name}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_panel(pack: ModuleType, tmp: Path) -> Iterator[RunningPanel]:
    panel = importlib.import_module(f"{pack.__name__}.web.panel")
    settings = tmp / "settings.json"
    url = panel.launch_panel(port=free_port(), demo_size_gb=DEMO_GB, settings_path=settings)
    try:
        yield RunningPanel(url, settings, panel, panel.panel_context(), pack)
    finally:
        panel.close_panel()
