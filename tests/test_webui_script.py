"""scripts/ferry_webui.py as a WebUI loads it (by file path, the host's ``modules`` importable),
against stand-in hosts: Forge (Gradio 6 here; tests/forge runs the real Forge on 4.40), A1111
without Forge's backend, A1111 on Gradio 3.41, and no WebUI at all. And the tab itself."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

gr = pytest.importorskip("gradio")
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ferry_webui.py"

# A stand-in WebUI: what Forge's modules offer the extension (modules.*, backend.patcher.unet).
STANDIN = {
    "modules/__init__.py": "",
    "modules/script_callbacks.py": (
        "tabs, started = [], []\non_ui_tabs = tabs.append\non_app_started = started.append\n"
    ),
    "modules/scripts.py": "class Script:\n    pass\n\nAlwaysVisible = object()\n",
    "modules/paths_internal.py": "import os\ndata_path = os.environ['STANDIN_DATA']\n",
    "modules/sd_models.py": "class _D:\n    sd_model = None\n\nmodel_data = _D()\n",
    "modules/shared.py": "class _S:\n    job_count = 0\n\nstate = _S()\n",
    "modules/ui_components.py": (
        "import gradio as gr\n\n"
        "class InputAccordion:\n"
        "    def __init__(self, value, label, elem_id=None):\n"
        "        self.value, self.label, self.elem_id = value, label, elem_id\n"
        "    def __enter__(self):\n"
        "        self.acc = gr.Accordion(self.label, open=self.value, elem_id=self.elem_id)\n"
        "        self.acc.__enter__()\n"
        "        return gr.Checkbox(self.value, label=self.label)\n"
        "    def __exit__(self, *exc):\n"
        "        return self.acc.__exit__(*exc)\n"
    ),
}
FORGE_BACKEND = {
    "backend/__init__.py": "",
    "backend/patcher/__init__.py": "",
    "backend/patcher/unet.py": "",
}


def webui(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def load_script(
    host: Path | None,
    after: str,
    gradio_version: str | None = None,
    times: int = 1,
    python: str = sys.executable,
) -> subprocess.CompletedProcess[str]:
    """Runs python: loads the script ``times`` times as a WebUI does, then runs ``after``."""
    code = "import importlib.util, sys\n"
    if host is not None:
        code += f"sys.path.insert(0, {str(host)!r})\n"
    if gradio_version is not None:
        code += f"import gradio\ngradio.__version__ = {gradio_version!r}\n"
    code += (
        f"for _ in range({times}):\n"
        f"    spec = importlib.util.spec_from_file_location('ferry_webui', {str(SCRIPT)!r})\n"
        "    mod = importlib.util.module_from_spec(spec)\n"
        "    spec.loader.exec_module(mod)\n"
    ) + after
    env = {
        "STANDIN_DATA": str(host or ""),
        "PATH": "/usr/bin:/bin",
        "GRADIO_ANALYTICS_ENABLED": "False",
    }
    return subprocess.run(
        [python, "-c", code],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
        env=env,
    )


GRADIO4_PYTHON = os.environ.get("FERRY_GRADIO4_PYTHON")


@pytest.mark.parametrize("gradio", ["6", "4.40"])
def test_in_forge_it_adds_the_accordion_the_tab_and_the_route(tmp_path: Path, gradio: str) -> None:
    """Built with this venv's Gradio 6 and with Forge's 4.40 (the second venv)."""
    if gradio == "4.40" and not GRADIO4_PYTHON:
        pytest.skip("FERRY_GRADIO4_PYTHON is unset (bash run.sh test makes .venv-gradio4)")
    host = webui(tmp_path, {**STANDIN, **FORGE_BACKEND})
    out = load_script(
        host,
        "from modules import script_callbacks as cb, scripts\n"
        "import gradio as gr\n"
        "cls = mod.FerryOffloadScript\n"
        "assert issubclass(cls, scripts.Script), cls\n"
        "s = cls()\n"
        "assert s.title() == 'Ferry offload' and s.show(False) is scripts.AlwaysVisible\n"
        "with gr.Blocks():\n"
        "    controls = s.ui(False)\n"
        "print(len(cb.tabs), len(cb.started), len(controls), len(s.infotext_fields))\n"
        "print([c.label for c in controls])\n"
        "print(gr.__version__)\n",
        python=GRADIO4_PYTHON if gradio == "4.40" and GRADIO4_PYTHON else sys.executable,
    ).stdout.splitlines()
    assert out[2].startswith(gradio)
    assert out[0] == "1 1 9 8"
    assert out[1] == str(
        ["Ferry offload", "How to cut the UNet", "Blocks per group", "Where the rest waits",
         "Disk folder", "Look-ahead", "VRAM budget (GiB)",
         "Use saved settings (the Ferry tab's Save, shared with ComfyUI; the controls above are then ignored)",
         "Offload the text encoder too"]
    )  # fmt: skip


def test_a_webui_without_forges_backend_gets_the_tab_and_one_line(tmp_path: Path) -> None:
    host = webui(tmp_path, STANDIN)
    r = load_script(
        host,
        "from modules import script_callbacks as cb\nprint(mod.FerryOffloadScript, len(cb.tabs), len(cb.started))\n",
        times=2,
    )
    assert r.stdout.strip() == "None 2 0"  # the WebUI clears its callbacks before a reload
    assert r.stderr.count("the offload accordion needs Stable Diffusion WebUI Forge") == 1


GRADIO3_PYTHON = os.environ.get("FERRY_GRADIO3_PYTHON")


@pytest.mark.parametrize("gradio", ["version-3.41.2-on-6", "3.41"])
def test_gradio_3_41_gets_a_notice_and_nothing_else(tmp_path: Path, gradio: str) -> None:
    """A1111 / reForge: the WebUI loads, the tab says what is not supported there and what to
    use instead, the console says it once; no script, no route. In CI Gradio 6 says it is
    3.41.2; with FERRY_GRADIO3_PYTHON (a Python with gradio==3.41.2, as A1111 pins it) the
    notice tab is built with the real 3.41."""
    if gradio == "3.41" and not GRADIO3_PYTHON:
        pytest.skip("set FERRY_GRADIO3_PYTHON to a Python with gradio==3.41.2 (A1111's)")
    real = GRADIO3_PYTHON if gradio == "3.41" else None
    host = webui(tmp_path, STANDIN)
    r = load_script(
        host,
        "from modules import script_callbacks as cb\n"
        "print(mod.FerryOffloadScript, len(cb.tabs), len(cb.started))\n"
        "[(blocks, title, elem_id)] = cb.tabs[-1]()\n"
        "print(type(blocks).__name__, title, elem_id)\n"
        "print([b.value for b in blocks.blocks.values() if type(b).__name__ == 'Markdown'][0])\n"
        "print(__import__('gradio').__version__)\n",
        gradio_version=None if real else "3.41.2",
        times=2,
        python=real or sys.executable,
    )
    lines = r.stdout.strip().splitlines()
    assert lines[3] == "3.41.2"
    assert lines[0] == "None 2 0" and lines[1] == "Blocks Ferry ferry_panel"
    assert "runs Gradio 3.41.2; Ferry's panel needs Gradio 4.40 or newer" in lines[2]
    assert "Use Ferry in Forge or in ComfyUI" in lines[2] and "python tools/panel.py" in lines[2]
    assert r.stderr.count("this WebUI runs Gradio 3.41.2") == 1


def test_outside_a_webui_it_does_nothing() -> None:
    r = load_script(
        None,
        "print(mod.FerryOffloadScript, 'gradio' in sys.modules, any('ferry-panel' in m for m in sys.modules))\n",
    )
    assert r.stdout.strip() == "None False False"


# ---- the tab, in this process ---------------------------------------------------------------
def test_tab_registers_on_gradio_6_and_builds_the_panel(pack: ModuleType) -> None:
    tab = importlib.import_module(f"{pack.__name__}.web.panel.webui_tab")
    monitor = importlib.import_module(f"{pack.__name__}.offload_core.tools.monitor").get_monitor()
    was_running = monitor.running
    registered: list[Any] = []
    assert tab.register_tab(SimpleNamespace(on_ui_tabs=registered.append), gr.__version__) is True
    try:
        [(blocks, title, elem_id)] = registered[0]()
        assert isinstance(blocks, gr.Blocks) and (title, elem_id) == ("Ferry", "ferry_panel")
    finally:
        if not was_running:
            monitor.stop()


@pytest.mark.parametrize(
    ("version", "ok"), [("3.41.2", False), ("4.39.0", False), ("4.40.0", True), ("6.31.0", True)]
)
def test_which_gradio_gets_the_panel(pack: ModuleType, version: str, ok: bool) -> None:
    compat = importlib.import_module(f"{pack.__name__}.web.panel.compat")
    assert compat.supported(version) is ok
