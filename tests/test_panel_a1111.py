"""The A1111/Forge tab: registered through on_ui_tabs where Gradio can draw the panel,
refused with a one-line hint on their older Gradio. A stand-in script_callbacks plays A1111."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

gr = pytest.importorskip("gradio")
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ferry_webui.py"


def test_tab_registers_on_gradio_6_and_builds_the_panel(pack: ModuleType) -> None:
    a1111 = importlib.import_module(f"{pack.__name__}.web.panel.a1111")
    monitor = importlib.import_module(f"{pack.__name__}.offload_core.tools.monitor").get_monitor()
    was_running = monitor.running
    registered: list[Any] = []
    fake = SimpleNamespace(on_ui_tabs=registered.append)
    assert a1111.register_tab(fake, "6.31.0") is True
    assert len(registered) == 1
    try:
        [(blocks, title, elem_id)] = registered[0]()
        assert isinstance(blocks, gr.Blocks) and (title, elem_id) == ("Ferry", "ferry_panel")
    finally:
        if not was_running:
            monitor.stop()


@pytest.mark.parametrize("version", ["3.41.2", "4.40.0"])
def test_older_gradio_gets_a_hint_not_a_broken_tab(
    pack: ModuleType, version: str, capsys: pytest.CaptureFixture[str]
) -> None:
    a1111 = importlib.import_module(f"{pack.__name__}.web.panel.a1111")
    registered: list[Any] = []
    assert a1111.register_tab(SimpleNamespace(on_ui_tabs=registered.append), version) is False
    assert registered == []
    assert (
        f"runs Gradio {version}; start the panel on its own with: python tools/panel.py"
        in capsys.readouterr().err
    )


def test_webui_script_registers_the_tab_through_the_hosts_callbacks(tmp_path: Path) -> None:
    """scripts/ferry_webui.py as a WebUI loads it: by file path, with the host's `modules`
    package importable (here a stand-in that records on_ui_tabs)."""
    host = tmp_path / "modules"
    host.mkdir()
    (host / "__init__.py").write_text("")
    (host / "script_callbacks.py").write_text("registered = []\non_ui_tabs = registered.append\n")
    code = (
        "import importlib.util, sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        f"spec = importlib.util.spec_from_file_location('ferry_webui', {str(SCRIPT)!r})\n"
        "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
        "from modules import script_callbacks\n"
        "print(len(script_callbacks.registered))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.strip().splitlines()[-1] == "1"


def test_webui_script_does_nothing_outside_a_webui() -> None:
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('ferry_webui', {str(SCRIPT)!r})\n"
        "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
        "print('gradio' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.strip() == "False"
