"""install.py, which ComfyUI-Manager and every WebUI run: it installs only what Ferry imports
and is missing, never torch or gradio, and pins the ones the host has."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

INSTALL = Path(__file__).resolve().parents[1] / "install.py"


def install_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ferry_install", INSTALL)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_with_everything_present_it_does_nothing() -> None:
    """As in Forge and in ComfyUI after requirements.txt: no pip, no output."""
    r = subprocess.run(
        [sys.executable, str(INSTALL)], capture_output=True, text=True, timeout=120, check=True
    )
    assert r.stdout == "" and r.stderr == ""


def test_the_pip_command_pins_the_hosts_torch_and_gradio_and_never_upgrades() -> None:
    mod = install_module()
    pins = mod.pins()
    assert f"torch=={importlib.metadata.version('torch')}" in pins
    assert any(p.startswith("gradio==") for p in pins)
    cmd = mod.pip_command(["psutil>=5.9"], "/tmp/c.txt")
    assert cmd[:4] == [sys.executable, "-m", "pip", "install"]
    assert cmd[cmd.index("-c") : cmd.index("-c") + 2] == ["-c", "/tmp/c.txt"]
    assert not any(a in cmd for a in ("-U", "--upgrade", "--force-reinstall"))
    assert {module for module, _ in mod.NEEDED}.isdisjoint({"torch", "gradio"})


def test_in_a_bare_python_it_installs_what_is_missing_and_no_torch(tmp_path: Path) -> None:
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    r = subprocess.run([py, str(INSTALL)], capture_output=True, text=True, timeout=600)
    if r.returncode != 0 and "No matching distribution" in r.stdout + r.stderr:
        pytest.skip("no package index reachable from here")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith(
        "Ferry: installing what is missing: psutil>=5.9 tqdm>=4.60 safetensors>=0.4.2"
    )
    check = "import importlib.util as u; print([bool(u.find_spec(m)) for m in ('psutil', 'tqdm', 'safetensors', 'torch', 'gradio')])"
    out = subprocess.run([py, "-c", check], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[True, True, True, False, False]"
    again = subprocess.run(
        [py, str(INSTALL)], capture_output=True, text=True, timeout=120, check=True
    )
    assert again.stdout == ""


def test_requirements_txt_is_pyprojects_dependencies_and_no_gradio() -> None:
    """ComfyUI-Manager pip-installs requirements.txt into ComfyUI's Python, the Registry reads
    pyproject's dependencies: both the same three, and never the optional panel's gradio (it
    brought 21 packages and a pillow downgrade into ComfyUI: docs/installers.md)."""
    import tomllib

    root = INSTALL.parent
    lines = (root / "requirements.txt").read_text().splitlines()
    reqs = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    assert sorted(reqs) == sorted(deps)
    assert not any(r.lower().startswith(("gradio", "torch")) for r in reqs)
