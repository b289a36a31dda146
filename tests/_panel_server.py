"""Starts the real panel (a real Gradio server) for a test module and stops it after."""

from __future__ import annotations

import importlib
import json
import os
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEMO_GB = 0.002  # 2 double + 4 single blocks: forwards take milliseconds


@dataclass
class RunningPanel:
    url: str
    settings_path: Path
    panel: ModuleType | None  # <pack>.web.panel (None: the panel runs in another process)
    ctx: Any
    pack: ModuleType | None

    def sub(self, name: str) -> ModuleType:
        assert self.pack is not None, "the panel runs in another process"
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


def run_panel_elsewhere(python: str, tmp: Path, gradio_version: str) -> Iterator[RunningPanel]:
    """tools/panel.py on the demo model with another Python (another Gradio): its URL."""
    settings = tmp / "settings.json"
    env = dict(os.environ, FERRY_SETTINGS=str(settings), GRADIO_ANALYTICS_ENABLED="False")
    proc = subprocess.Popen(
        [python, str(REPO / "tools" / "panel.py"), "--no-browser", "--size-gb", str(DEMO_GB),
         "--port", str(free_port())],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("Ferry panel: http://"), (
            line,
            proc.stderr.read() if proc.stderr else "",
        )
        url = line.split(": ", 1)[1]
        with urllib.request.urlopen(url + "config", timeout=30) as r:
            got = json.loads(r.read())["version"]
        assert got == gradio_version, f"{python} serves Gradio {got}, not {gradio_version}"
        yield RunningPanel(url, settings, None, None, None)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
