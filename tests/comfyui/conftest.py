"""The opt-in real-ComfyUI suite: skipped unless FERRY_COMFYUI points at a ComfyUI checkout.

    FERRY_COMFYUI=/path/to/ComfyUI [FERRY_COMFYUI_PYTHON=/path/to/python] pytest tests/comfyui

Starts that ComfyUI headless on the CPU (its own venv's python by default: <checkout>/venv)
with a fresh base directory: custom_nodes/ComfyUI-Ferry is a symlink to this repository (a
hyphenated folder, as ComfyUI-Manager names it), plus two test-only node packs (conditioning
and faults; the CPU stand-in for NVIDIA's defaults, off unless a server is started with
FERRY_STANDIN); the models are a tiny SD3 (MMDiT) and a LoRA with random weights, written here
by ComfyUI's own MMDiT class, and the same SD3 in ComfyUI's quantized formats.

The same suite runs on each core Ferry supports; `bash tests/comfyui/run_cores.sh` runs it on
every checkout it is given (default: the three under /work/comfy).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
COMFY = os.environ.get("FERRY_COMFYUI")

sys.path.insert(0, str(HERE))


def core_has(rel: str, needle: str) -> bool:
    """Whether the core under test (FERRY_COMFYUI) has ``needle`` in its file ``rel``."""
    p = Path(COMFY) / rel if COMFY else None
    return p is not None and p.is_file() and needle in p.read_text(errors="replace")


#: A core with dynamic VRAM (v0.15+): its patcher hands Ferry a non-dynamic delegate.
HAS_AIMDO = core_has("comfy/model_patcher.py", "def get_non_dynamic_delegate")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(
        reason="set FERRY_COMFYUI to a ComfyUI checkout to run the real-ComfyUI suite"
    )
    for item in items:
        if Path(str(item.fspath)).is_relative_to(HERE):
            item.add_marker(pytest.mark.comfyui)
            if not COMFY:
                item.add_marker(skip)


@dataclass
class Server:
    url: str
    base: Path
    log: Path
    proc: subprocess.Popen

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def _python(comfy: Path) -> str:
    explicit = os.environ.get("FERRY_COMFYUI_PYTHON")
    if explicit:
        return explicit
    venv = comfy / "venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def core_env() -> dict[str, str]:
    """The environment a core's python runs in here."""
    return {
        **os.environ,
        "TORCHAO_FORCE_SKIP_LOADING_SO_FILES": "1",
        # site/sitecustomize.py: stand-ins for torchvision, torchaudio and av where missing.
        "FERRY_REPO": str(REPO),
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(HERE / "site"), os.environ.get("PYTHONPATH", "")) if p
        ),
    }


def make_base(
    base: Path,
    py: str,
    comfy: Path,
    script: str = "make_tiny_models.py",
    *args: str,
    timeout: float = 300,
) -> None:
    """A ComfyUI base directory: this pack (hyphenated folder), the test nodes, tiny models
    (written by ``script`` with ComfyUI's python: ``script <checkout> <models dir> *args``)."""
    custom = base / "custom_nodes"
    custom.mkdir()
    (custom / "ComfyUI-Ferry").symlink_to(REPO, target_is_directory=True)
    for pack in ("ferry_test_nodes.py", "ferry_standin_nodes.py"):
        shutil.copy(HERE / pack, custom / pack)
    run_maker(base, py, comfy, script, *args, timeout=timeout)


def run_maker(
    base: Path, py: str, comfy: Path, script: str, *args: str, timeout: float = 300
) -> None:
    """Writes more models into ``base`` with a maker of this folder, run by ComfyUI's python:
    ``script <checkout> <models dir> *args``."""
    subprocess.run(
        [py, str(HERE / script), str(comfy), str(base / "models"), *args],
        check=True,
        cwd=base,
        timeout=timeout,
        env=core_env(),
    )


def start_server(
    comfy: Path,
    py: str,
    base: Path,
    preexec_fn: Callable[[], None] | None = None,
    *,
    standin: str = "",
    args: tuple[str, ...] = (),
) -> Server:
    """Starts ComfyUI headless on the CPU with ``base`` and waits until Ferry's route answers.
    ``standin``: the switches of ferry_standin_nodes.py to turn on ("aimdo,lora-fp16");
    ``args``: more command-line flags for ComfyUI."""
    port = _free_port()
    env = {
        **core_env(),
        "FERRY_STANDIN": standin,
        "FERRY_SETTINGS": str(base / "ferry-settings.json"),
    }
    log = base / f"comfyui-{port}.log"
    cmd = [py, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port)]
    cmd += ["--base-directory", str(base), "--database-url", f"sqlite:///{base / 'comfy.db'}"]
    cmd += list(args)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=comfy, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=preexec_fn
        )
    srv = Server(f"http://127.0.0.1:{port}", base, log, proc)
    deadline = time.monotonic() + 180
    while True:
        if proc.poll() is not None:
            pytest.fail(f"ComfyUI exited with {proc.returncode}:\n{srv.log_tail()}")
        try:
            with urllib.request.urlopen(srv.url + "/ferry/stats", timeout=5):
                return srv
        except OSError:
            if time.monotonic() > deadline:
                stop_server(srv)
                pytest.fail(f"ComfyUI did not answer in 180 s:\n{srv.log_tail()}")
            time.sleep(0.5)


@contextlib.contextmanager
def limited_server(
    base: Path, limit: int, name: str, *, standin: str = ""
) -> Iterator[tuple[Server, Any]]:
    """ComfyUI started inside a memory cgroup of ``limit`` bytes (tests/cgroup_limit.py);
    stopped and the cgroup removed after."""
    from tests import cgroup_limit

    comfy, py = comfy_checkout()
    group = cgroup_limit.MemoryGroup(limit, name=name)
    srv = start_server(comfy, py, base, preexec_fn=group.enter, standin=standin)
    try:
        yield srv, group
    finally:
        stop_server(srv)
        group.remove()


def stop_server(srv: Server) -> None:
    srv.proc.terminate()
    try:
        srv.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        srv.proc.kill()
        srv.proc.wait()


def comfy_checkout() -> tuple[Path, str]:
    assert COMFY, "FERRY_COMFYUI is not set"
    comfy = Path(COMFY).resolve()
    assert (comfy / "main.py").is_file(), f"{comfy} is not a ComfyUI checkout (no main.py)"
    return comfy, _python(comfy)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    comfy, py = comfy_checkout()
    base = tmp_path_factory.mktemp("comfy-base")
    make_base(base, py, comfy)
    srv = start_server(comfy, py, base)
    try:
        yield srv
    finally:
        stop_server(srv)
