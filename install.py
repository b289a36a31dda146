"""Ferry's install hook: ComfyUI-Manager runs it after installing requirements.txt, and a WebUI
(Forge, A1111) runs every extension's install.py at start-up, in the WebUI's own Python.

Safe in both: it installs only the packages Ferry imports that are missing, never upgrades one
that is present, never touches torch or gradio (the host's own), and pins the installed torch
and gradio with a constraint file, so no dependency can drag another version in (a different
torch can mean a multi-GB CUDA download, a different gradio a broken WebUI). With everything
present, as in Forge and ComfyUI, it does nothing.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import tempfile

#: (module Ferry imports, what pip installs when it is missing). No torch, no gradio: the host's.
NEEDED = (
    ("psutil", "psutil>=5.9"),
    ("tqdm", "tqdm>=4.60"),
    ("safetensors", "safetensors>=0.4.2"),
)
#: Packages whose installed version is pinned while installing (never changed by Ferry).
HOST_OWNED = ("torch", "gradio")


def missing() -> list[str]:
    return [spec for module, spec in NEEDED if importlib.util.find_spec(module) is None]


def pins() -> list[str]:
    out = []
    for name in HOST_OWNED:
        try:
            out.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def pip_command(packages: list[str], constraints: str) -> list[str]:
    # No --upgrade: pip installs what is missing and leaves what is present.
    return [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-c", constraints, *packages]  # fmt: skip


def main() -> int:
    todo = missing()
    if not todo:
        return 0
    print(f"Ferry: installing what is missing: {' '.join(todo)}", flush=True)
    fd, constraints = tempfile.mkstemp(prefix="ferry-constraints-", suffix=".txt")
    try:
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(pins()) + "\n")
        return subprocess.run(pip_command(todo, constraints), check=False).returncode
    finally:
        os.unlink(constraints)


if __name__ == "__main__":
    raise SystemExit(main())
