"""Ferry installed by the real ComfyUI-Manager, as a user installs it from a git URL.

The Manager is the `comfyui-manager` package at the version the core pins in its
manager_requirements.txt (ComfyUI v0.33.0: ``comfyui_manager==4.2.2``), started by the core's own
``--enable-manager`` flag. The test never touches the checkout under test nor its venv: it copies
the checkout (without venv/) into a temporary folder and makes a fresh venv there whose
site-packages reach the original venv's through a .pth line (so torch and the core's requirements
are the ones the user has, read-only), then pip-installs manager_requirements.txt into the fresh
venv with this repository's constraints.txt (torch==2.13.0).

What a user does, then:
- config.ini in the Manager's folder (<base>/user/__manager/config.ini):
  ``allow_git_url_install = true`` (4.2.2 refuses the git-URL route without it, whatever
  ``security_level``; 4.0.4, ComfyUI v0.8.0's pin, gates it by ``security_level = normal-``), ``network_mode = offline`` (the setting for a machine behind a firewall: the
  Manager reads its channel and Registry lists from its cache or the copies in its package
  instead of fetching them), ``use_uv = false`` (uv ignores pip's configuration, the index a
  firewalled machine has);
- "Install via Git URL": the Manager's route ``POST /v2/customnode/install/git_url`` with the URL
  as the body (a bare clone of this repository's HEAD, ``file://localhost/...``: 4.2.2 accepts only
  a URL with a host part). The route is served by the Manager's legacy UI, which 4.2.2 loads with
  ``--enable-manager-legacy-ui``; the new UI installs only packs listed in a channel;
- the Manager's restart (``/v2/manager/reboot``, POST in 4.2.2, GET in 4.0.4: it re-executes the
  same command line);
- then Ferry's nodes are listed in /object_info and torch in the server's venv is unchanged.

    FERRY_COMFYUI=/work/comfy/v0.33.0 pytest tests/comfyui/test_comfyui_manager_install.py
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, comfy_checkout, core_env

from tests.node_schemas import node_schemas

FOLDER = "ComfyUI-Ferry"  # the Manager names the folder after the URL's last part
MANAGER_FLAGS = ("--enable-manager", "--enable-manager-legacy-ui")
CONFIG = """[default]
network_mode = offline
security_level = {security_level}
allow_git_url_install = true
use_uv = false
"""
TORCH_CODE = "import torch, importlib.metadata as m; print(torch.__version__, torch.__file__, m.version('torch'))"


def manager_pin(comfy: Path) -> str:
    """The comfyui_manager version the core pins (manager_requirements.txt), e.g. "4.2.2"."""
    for line in (comfy / "manager_requirements.txt").read_text().splitlines():
        name, _, version = line.partition("==")
        if name.strip().lower().replace("-", "_") == "comfyui_manager" and version:
            return version.strip()
    raise AssertionError(f"{comfy}/manager_requirements.txt pins no comfyui_manager version")


def config_for(pin: str) -> str:
    """config.ini as a user sets it for that Manager: 4.2 moved the git-URL gate from
    ``security_level`` (``normal-`` allows it on a local listener) to ``allow_git_url_install``."""
    major, minor = (int(x) for x in pin.split(".")[:2])
    return CONFIG.format(security_level="normal" if (major, minor) >= (4, 2) else "normal-")


@dataclass
class Installed:
    """What the Manager did, as the fixture saw it step by step."""

    pin: str
    install_status: int
    torch_before: str
    torch_after: str
    object_info: dict[str, Any]
    manager_version: str
    log: str
    base: Path
    venv: Path
    url: str


def _python_of(py: str, code: str) -> str:
    return subprocess.run(
        [py, "-c", code], check=True, capture_output=True, text=True, env=core_env(), timeout=120
    ).stdout.strip()


def _fresh_venv(checkout_py: str, where: Path) -> Path:
    """A venv at ``where`` over the checkout venv's packages (read-only, through a .pth line)."""
    base_python, purelib = _python_of(
        checkout_py,
        "import sys, sysconfig; print(sys._base_executable); print(sysconfig.get_paths()['purelib'])",
    ).splitlines()
    subprocess.run([base_python, "-m", "venv", str(where)], check=True, timeout=300)
    py = where / "bin" / "python"
    own = _python_of(str(py), "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    (Path(own) / "zz_checkout_venv.pth").write_text(purelib + "\n")
    return py


def _request(url: str, data: bytes | None = None, timeout: float = 60) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    if data is not None:
        # Not a "simple" form type: 4.2.2 refuses those on its POST routes (CSRF).
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _wait(url: str, proc: subprocess.Popen, log: Path, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while True:
        if proc.poll() is not None:
            pytest.fail(f"ComfyUI exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                pytest.fail(f"{url} did not answer in {seconds} s:\n{log.read_text()[-4000:]}")
            time.sleep(1)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    comfy, checkout_py = comfy_checkout()
    if "--enable-manager" not in (comfy / "comfy" / "cli_args.py").read_text():
        pytest.skip(f"{comfy} has no --enable-manager flag (ComfyUI v0.33.0 has)")
    pin = manager_pin(comfy)
    root = tmp_path_factory.mktemp("manager")
    copy = root / "ComfyUI"
    shutil.copytree(comfy, copy, ignore=shutil.ignore_patterns("venv", "__pycache__"))
    py = _fresh_venv(checkout_py, copy / "venv")
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "-r", str(copy / "manager_requirements.txt"),
         "-c", str(REPO / "constraints.txt")],
        check=True, timeout=900,
    )  # fmt: skip
    torch_before = _python_of(str(py), TORCH_CODE)

    bare = root / f"{FOLDER}.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(REPO), str(bare)], check=True)
    url = f"file://localhost{bare}"

    base = root / "base"
    (base / "custom_nodes").mkdir(parents=True)
    (base / "user" / "__manager").mkdir(parents=True)
    (base / "user" / "__manager" / "config.ini").write_text(config_for(pin))

    port = _free_port()
    server = f"http://127.0.0.1:{port}"
    log = base / "comfyui.log"
    cmd = [str(py), "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
           "--base-directory", str(base), "--database-url", f"sqlite:///{base / 'comfy.db'}",
           *MANAGER_FLAGS]  # fmt: skip
    env = {**core_env(), "FERRY_SETTINGS": str(base / "ferry-settings.json")}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=copy, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        _wait(server + "/system_stats", proc, log)
        _, version = _request(server + "/v2/manager/version")
        # The Manager clones, pip-installs requirements.txt and runs install.py before answering.
        status, _ = _request(server + "/v2/customnode/install/git_url", url.encode(), timeout=900)
        if status == 200:
            # The Manager's restart: answers nothing (the process re-executes itself).
            try:
                rebooted, _ = _request(server + "/v2/manager/reboot", b"", timeout=30)
                if rebooted == 405:  # 4.0.4 restarts on a GET
                    _request(server + "/v2/manager/reboot", timeout=30)
            except OSError:
                pass
            time.sleep(3)
            _wait(server + "/ferry/stats", proc, log)
            _, info = _request(server + "/object_info", timeout=120)
            object_info = json.loads(info)
        else:
            object_info = {}
        torch_after = _python_of(str(py), TORCH_CODE)
        yield Installed(
            pin=pin,
            install_status=status,
            torch_before=torch_before,
            torch_after=torch_after,
            object_info=object_info,
            manager_version=version.decode(errors="replace"),
            log=log.read_text(errors="replace"),
            base=base,
            venv=copy / "venv",
            url=url,
        )
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_pinned_manager_runs_offline(installed: Installed) -> None:
    # The Manager that answers is the core's pin (4.2.2 in ComfyUI v0.33.0).
    assert installed.manager_version.strip().lstrip("Vv") == installed.pin, (
        installed.manager_version,
        installed.pin,
    )
    assert "[ComfyUI-Manager] network_mode: offline" in installed.log
    # What the Manager prints when it tried the network and fell back to its own copies.
    assert "Due to a network error" not in installed.log


def test_the_git_url_route_installs_ferry(installed: Installed) -> None:
    assert installed.install_status == 200, installed.log[-4000:]
    target = installed.base / "custom_nodes" / FOLDER
    assert (target / "__init__.py").is_file() and (target / ".git").is_dir()
    remote = subprocess.run(
        ["git", "-C", str(target), "remote", "get-url", "origin"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    assert remote == installed.url
    # The Manager ran Ferry's install.py (its log names the command) and said it succeeded.
    assert "'install.py']" in installed.log and "Installation was successful." in installed.log


def test_after_the_managers_restart_every_ferry_node_is_listed(installed: Installed) -> None:
    assert "Restarting..." in installed.log
    declared = set(node_schemas())
    listed = {
        name
        for name, spec in installed.object_info.items()
        if spec.get("python_module", "").endswith(FOLDER)
    }
    assert declared and listed == declared, (sorted(listed), sorted(declared))
    timed = [
        line
        for line in installed.log.splitlines()
        if "seconds" in line and line.endswith(f"custom_nodes/{FOLDER}")
    ]
    assert timed and not any("IMPORT FAILED" in line for line in timed), timed


def test_torch_in_the_servers_venv_is_unchanged(installed: Installed) -> None:
    assert installed.torch_after == installed.torch_before, (
        installed.torch_before,
        installed.torch_after,
    )
    # Nothing named torch was installed into the server's venv itself either.
    site = next((installed.venv / "lib").glob("python3*/site-packages"))
    assert not list(site.glob("torch-*.dist-info")), sorted(p.name for p in site.iterdir())


def test_what_the_manager_did_is_printed(
    installed: Installed, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run's record (docs/installers.md keeps one): which installer the Manager used for
    requirements.txt (pip, or uv where `python -m pip --version` took over its 5 s), what it
    installed into the server's venv, and torch before and after."""
    log = installed.log.splitlines()
    installed_lines = [
        line.strip("[!] ").strip()
        for line in log
        if "Successfully installed" in line or line.lstrip("[!] ").startswith("+ ")
    ]
    backend = "uv (pip did not answer in 5 s)" if "Falling back to uv" in installed.log else "pip"
    listed = sorted(
        n for n, s in installed.object_info.items() if s.get("python_module", "").endswith(FOLDER)
    )
    with capsys.disabled():
        print(f"\nComfyUI-Manager {installed.manager_version.strip()}, installer: {backend}")
        print(f"git URL: {installed.url}")
        print("installed into the server's venv:", *installed_lines, sep="\n  ")
        print(f"torch before: {installed.torch_before}\ntorch after:  {installed.torch_after}")
        print(f"Ferry nodes listed after the restart ({len(listed)}): {', '.join(listed)}")
    assert installed_lines, "the log names no package the Manager installed"
