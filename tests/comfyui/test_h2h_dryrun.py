"""The head-to-head's dry run with real ComfyUI (opt-in: FERRY_COMFYUI, see conftest.py).

Every row samples the same tiny SD3 with ComfyUI's KSampler in process: ComfyUI core's
partial loading, the Ferry pack loaded as ComfyUI loads it, diffusers group offloading. The
Ferry rows must be bit-identical to resident. Needs diffusers (and accelerate) in ComfyUI's
Python; without them their rows are reported as skipped and only the rest is checked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _cells(out: str, name: str) -> list[str]:
    lines = [ln for ln in out.splitlines() if ln.startswith(f"| {name} |")]
    assert len(lines) == 1, f"expected one {name} row in:\n{out[-4000:]}"
    return [c.strip() for c in lines[0].strip("|").split("|")]


def test_h2h_dry_run_with_comfyui(tmp_path: Path) -> None:
    env = {**os.environ, "FERRY_PY": sys.executable, "FERRY_H2H_DIR": str(tmp_path / "h2h")}
    p = subprocess.run(
        ["bash", "tools/gpu_suite.sh", "h2h"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
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
