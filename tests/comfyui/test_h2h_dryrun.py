"""The head-to-head's dry run with real ComfyUI (opt-in: FERRY_COMFYUI, see conftest.py).

Every row samples the same tiny SD3 with ComfyUI's KSampler in process: ComfyUI core's
partial loading, the Ferry pack loaded as ComfyUI loads it, diffusers group offloading; and,
with a core that has dynamic VRAM (FERRY_COMFYUI_DYNAMIC, or FERRY_COMFYUI itself when it has
it; tests/comfyui/run_cores.sh sets it), the dyn-* rows on that core: its defaults, --fast-disk
and Ferry on it, listed first. Every row must be bit-identical to its core's resident row,
except ComfyUI's own lowvram rows (equal or not, the column must be filled). Needs diffusers
(and accelerate) in ComfyUI's Python for the diffusers rows; without it they are reported as
skipped and only the rest is checked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import COMFY, HAS_AIMDO

REPO = Path(__file__).resolve().parents[2]
DYN_ROWS = ("dyn-resident", "dyn-default", "dyn-ferry-pinned", "dyn-fast-disk", "dyn-ferry-disk")


def _cells(out: str, name: str) -> list[str]:
    lines = [ln for ln in out.splitlines() if ln.startswith(f"| {name} |")]
    assert len(lines) == 1, f"expected one {name} row in:\n{out[-4000:]}"
    return [c.strip() for c in lines[0].strip("|").split("|")]


def _dynamic_core() -> str | None:
    return os.environ.get("FERRY_COMFYUI_DYNAMIC") or (COMFY if HAS_AIMDO else None)


def test_h2h_dry_run_with_comfyui(tmp_path: Path) -> None:
    dyn = _dynamic_core()
    env = {**os.environ, "FERRY_PY": sys.executable, "FERRY_H2H_DIR": str(tmp_path / "h2h"),
           "FERRY_COMFYUI_DYNAMIC": dyn or ""}  # fmt: skip
    p = subprocess.run(
        ["bash", "tools/gpu_suite.sh", "h2h"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert "backend comfy" in out, out[-4000:]
    assert "skipped comfy-" not in out
    for name in ("resident", "ferry-pinned", "ferry-ram", "ferry-disk"):
        assert _cells(out, name)[-1] == "yes", _cells(out, name)
    for name in ("comfy-lowvram", "comfy-lowvram-async"):
        cells = _cells(out, name)
        assert float(cells[2]) > 0, cells
        assert cells[-1].startswith(("yes", "NO")), cells
    if "skipped diffusers-block: diffusers not installed" not in out:
        for name in ("diffusers-block", "diffusers-disk"):
            assert float(_cells(out, name)[2]) > 0
    if dyn is None:
        assert "skipped dyn-default: FERRY_COMFYUI_DYNAMIC unset" in out
        return
    # The current core's rows: listed first (a 10-minute GPU call gets them first), each
    # bit-identical to that core's resident row, and the CPU says dynamic VRAM stayed off.
    rows = [ln.split("|")[1].strip() for ln in out.splitlines() if ln.startswith("| ")]
    assert rows[1 : 1 + len(DYN_ROWS)] == list(DYN_ROWS), rows
    for name in DYN_ROWS:
        assert _cells(out, name)[-1] == "yes", _cells(out, name)
        assert f"{name}: dynamic VRAM off" in out
    assert "dynamic VRAM is off on a CPU" in out
