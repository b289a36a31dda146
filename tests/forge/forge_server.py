"""Starting and stopping a real Forge for the suite (conftest.py's fixtures use these)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from forge_client import Forge
from make_models import VERSION

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


class ForgeStartError(RuntimeError):
    pass


def forge_checkout() -> tuple[Path, str]:
    forge_dir = os.environ.get("FERRY_FORGE")
    assert forge_dir, "FERRY_FORGE is not set"
    forge = Path(forge_dir).resolve()
    assert (forge / "launch.py").is_file() and (forge / "backend").is_dir(), (
        f"{forge} is not a Forge checkout (no launch.py and backend/)"
    )
    explicit = os.environ.get("FERRY_FORGE_PYTHON")
    venv = forge / "venv" / "bin" / "python"
    return forge, explicit or (str(venv) if venv.exists() else sys.executable)


def models_dir(forge: Path, py: str) -> Path:
    """The suite's checkpoints and LoRA, written once per VERSION of make_models.py."""
    root = Path(
        os.environ.get("FERRY_FORGE_MODELS") or Path(tempfile.gettempdir()) / "ferry-forge-models"
    )
    if (root / "VERSION").is_file() and (root / "VERSION").read_text().strip() == str(VERSION):
        return root
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [py, str(HERE / "make_models.py"), str(forge), str(root)],
        cwd=forge, env=_env(root / "unused.json"), check=True, timeout=1800,
    )  # fmt: skip
    return root


def _env(settings: Path) -> dict[str, str]:
    return {
        **os.environ,
        "FERRY_SETTINGS": str(settings),
        "GRADIO_ANALYTICS_ENABLED": "False",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(HERE / "site"), os.environ.get("PYTHONPATH", "")) if p
        ),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    forge: Forge
    data: Path
    log: Path
    proc: subprocess.Popen[bytes]
    settings: Path

    def log_tail(self, n: int = 80) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def start_forge(data: Path, models: Path, *, with_ferry: bool = True) -> Server:
    """Forge headless on the CPU with its API and UI, this repository as an extension."""
    forge, py = forge_checkout()
    (data / "extensions").mkdir(parents=True, exist_ok=True)
    if with_ferry:
        (data / "extensions" / "ferry").symlink_to(REPO, target_is_directory=True)
    # Both servers: the test extension that serves the last latents (not part of Ferry).
    (data / "extensions" / "ferry-test-latents").symlink_to(HERE / "latents_ext")
    port = free_port()
    settings = data / "ferry-settings.json"
    log = data / f"forge-{port}.log"
    cmd = [py, "launch.py", "--always-cpu", "--skip-torch-cuda-test", "--skip-prepare-environment",
           "--skip-install", "--api", "--port", str(port), "--data-dir", str(data),
           # Forge serves only files under --data-dir: its own UI scripts too, without this.
           "--gradio-allowed-path", str(forge),
           "--ckpt-dir", str(models / "Stable-diffusion"), "--lora-dir", str(models / "Lora")]  # fmt: skip
    if (models / "VAE").is_dir():  # additional modules (the GGUF suite's VAE and text encoder)
        cmd += ["--vae-dir", str(models / "VAE")]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=forge, stdout=out, stderr=subprocess.STDOUT, env=_env(settings)
        )
    srv = Server(Forge(f"http://127.0.0.1:{port}"), data, log, proc, settings)
    deadline = time.monotonic() + 600
    probe = "/ferry/stats" if with_ferry else "/sdapi/v1/sd-models"
    while True:
        if proc.poll() is not None:
            raise ForgeStartError(f"Forge exited with {proc.returncode}:\n{srv.log_tail()}")
        try:
            with urllib.request.urlopen(srv.forge.url + probe, timeout=5):
                return srv
        except OSError:
            if time.monotonic() > deadline:
                stop_forge(srv)
                raise ForgeStartError(f"Forge did not answer in 600 s:\n{srv.log_tail()}") from None
            time.sleep(0.5)


def stop_forge(srv: Server) -> None:
    srv.proc.terminate()
    try:
        srv.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        srv.proc.kill()
        srv.proc.wait()
