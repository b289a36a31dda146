"""The pack imports the way ComfyUI imports it, outside ComfyUI, cheaply and without side effects."""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import PACK_NAME, REPO

PURE_MODULES = (
    "input_error", "planning.config", "patcher.live_layout", "patcher.dynamic",
    "patcher.recovery", "ui.stats", "ui.report", "ui.api", "ui.json_body", "ui.pusher", "ui.prompt_reads", "planning.prompt_networks",
    "planning.group_source",
    "planning.loader_swap",
    "planning.loader_files",
)  # fmt: skip
COMFY_MODULES = (
    "extension", "offload_node", "loader_node", "report_node", "text_encoder_node",
    "controlnet_node", "model_patch_node", "clip_vision_node", "text_encoder_loader_node",
    "compile_node", "offload_inputs", "planning.graph_plan", "planning.auto_settings", "planning.offload_policy",
    "patcher.patcher", "patcher.comfy_core", "patcher.load_steps", "patcher.block_compile",
    "patcher.hold", "patcher.bake_lora", "ui.routes", "loading.quant_loader",
    "loading.text_encoder_stream", "loading.stream_loader", "loading.core_quant_stream",
    "checkpoint_loader_node", "loading.checkpoint_stream",
)  # fmt: skip


def test_every_module_of_nodes_is_checked_below() -> None:
    # A module added to a room of nodes/ is imported by one of the two tests below.
    found = {
        ".".join(p.relative_to(REPO / "nodes").with_suffix("").parts)
        for p in (REPO / "nodes").rglob("*.py")
        if p.name != "__init__.py"
    }
    assert found == set(PURE_MODULES) | set(COMFY_MODULES)


def _run(code: str) -> dict:
    """Runs ``code`` in a fresh interpreter (sys.modules and threads start clean); it prints JSON."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={"PYTHONPATH": "", "TORCHAO_FORCE_SKIP_LOADING_SO_FILES": "1", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


LOAD = f"""
import importlib.util, json, sys, threading, time
spec = importlib.util.spec_from_file_location(
    {PACK_NAME!r}, {str(REPO / "__init__.py")!r}, submodule_search_locations=[{str(REPO)!r}])
mod = importlib.util.module_from_spec(spec)
sys.modules[{PACK_NAME!r}] = mod
t0 = time.perf_counter()
spec.loader.exec_module(mod)
dt = time.perf_counter() - t0
"""


def test_pack_import_is_light_and_has_no_side_effects() -> None:
    r = _run(
        LOAD
        + """
import inspect
heavy = [m for m in ("torch", "gradio", "comfy", "server", "aiohttp", "offload_core") if m in sys.modules]
print(json.dumps({"dt": dt, "heavy": heavy, "threads": threading.active_count(),
    "web": mod.WEB_DIRECTORY, "entry": inspect.iscoroutinefunction(mod.comfy_entrypoint),
    "v1": hasattr(mod, "NODE_CLASS_MAPPINGS")}))
"""
    )
    assert r["heavy"] == [], f"the pack's __init__ imported {r['heavy']}"
    assert r["threads"] == 1
    assert r["entry"] is True
    # ComfyUI ignores comfy_entrypoint in a module that also has NODE_CLASS_MAPPINGS.
    assert r["v1"] is False
    assert r["dt"] < 0.3, f"importing the pack took {r['dt']:.3f} s"
    assert (REPO / r["web"] / "ferry.js").is_file()


def test_pure_node_modules_import_without_comfyui_gradio_threads_or_cuda() -> None:
    mods = ", ".join(repr(m) for m in PURE_MODULES)
    r = _run(
        LOAD
        + f"""
import importlib
for m in ({mods},):
    importlib.import_module({PACK_NAME!r} + ".nodes." + m)
import torch
print(json.dumps({{"comfy": [m for m in ("comfy", "server", "folder_paths", "gradio", "aiohttp") if m in sys.modules],
    "threads": threading.active_count(), "cuda": torch.cuda.is_initialized()}}))
"""
    )
    assert r == {"comfy": [], "threads": 1, "cuda": False}


def test_comfyui_modules_say_clearly_they_need_comfyui() -> None:
    # Outside ComfyUI these fail on ComfyUI's own modules, not on a broken import of ours.
    r = _run(
        LOAD
        + f"""
import importlib
errs = {{}}
for m in {COMFY_MODULES!r}:
    try:
        importlib.import_module({PACK_NAME!r} + ".nodes." + m)
        errs[m] = None
    except ModuleNotFoundError as e:
        errs[m] = e.name
print(json.dumps(errs))
"""
    )
    for m, missing in r.items():
        if m == "ui.routes" and missing is None:
            # Its only host module is aiohttp, which the dev requirements install (the route
            # fuzz test serves it): importing it there is right, not a missed ComfyUI import.
            assert importlib.util.find_spec("aiohttp") is not None, m
            continue
        assert missing is not None and missing.split(".")[0] in {
            "comfy",
            "comfy_api",
            "folder_paths",
            "aiohttp",
            "server",
        }, (m, missing)


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
    return out


@pytest.mark.parametrize(
    "path",
    [REPO / "__init__.py", *sorted((REPO / "nodes").rglob("*.py"))],
    ids=lambda p: p.relative_to(REPO).as_posix(),
)
def test_only_relative_imports_of_the_pack(path: Path) -> None:
    # ComfyUI-Manager names the folder with hyphens and ComfyUI has its own top-level `nodes`:
    # an absolute import of a pack module would load the wrong module or none.
    bad = [(n, m) for n, m in _imports(path) if m.split(".")[0] in {"nodes", "offload_core", "web"}]
    assert bad == []


@pytest.mark.parametrize("path", sorted((REPO / "nodes").glob("*_node.py")), ids=lambda p: p.name)
def test_node_modules_are_thin(path: Path) -> None:
    # A node file declares inputs and calls tested logic: no loops over weights, no torch maths.
    tree = ast.parse(path.read_text())
    loops = [n.lineno for n in ast.walk(tree) if isinstance(n, (ast.For, ast.While))]
    assert loops == [], f"{path.name} has loops at lines {loops}: move that logic out of the node"
    assert not any(m == "torch" for _, m in _imports(path))
    assert len(path.read_text().splitlines()) < 220


def test_frontend_extension_parses_and_wires_the_routes() -> None:
    js = REPO / "web" / "comfyui" / "ferry.js"
    text = js.read_text()
    for needle in (
        "registerSidebarTab",
        "registerExtension",
        '"ferry.stats"',
        '"/ferry/stats"',
        '"/ferry/panel"',
        "settings:",
    ):
        assert needle in text, needle
    exe = shutil.which("node")
    if exe is None:
        pytest.skip("node is not installed (only the syntax check needs it)")
    node = subprocess.run([exe, "--check", str(js)], capture_output=True, text=True)
    assert node.returncode == 0, node.stderr
