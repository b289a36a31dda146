"""The GPU suite's CPU dry run, as CI runs it: no GPU, no ComfyUI (FERRY_COMFYUI unset).

It must run the head-to-head pipeline at a tiny size, print its table with the Ferry rows
bit-identical to resident, run the issue-41 rows (the RAM tier staged, pageable and pinned;
GGUF + LoRAs, skipped without ComfyUI), say which rows it skipped and why, say "no GPU" once,
and exit 0.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
HEADER = (
    "| row | cap | s/step | x resident | peak VRAM | peak RssAnon | peak RssFile | "
    "H2D GB/s (/ pinned) | disk GB/s (/ raw) | equal |"
)


def _row(out: str, name: str) -> list[str]:
    lines = [ln for ln in out.splitlines() if ln.startswith(f"| {name} |")]
    assert len(lines) == 1, f"expected one {name} row in:\n{out}"
    return [c.strip() for c in lines[0].strip("|").split("|")]


def _compare_row(out: str, name: str) -> list[str]:
    """bench/compare.py's main table row of ``name`` (padded cells; the first table)."""
    for ln in out.splitlines():
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        if ln.startswith("|") and cells[0] == name and len(cells) >= 10:
            return cells
    raise AssertionError(f"no {name} row in:\n{out[-4000:]}")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run is what runs without a GPU")
def test_gpu_suite_dry_run_without_comfyui(tmp_path: Path) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("FERRY_COMFYUI", "FERRY_COMFYUI_DYNAMIC", "OUT")
    }
    env.update(FERRY_PY=sys.executable, FERRY_H2H_DIR=str(tmp_path / "h2h"))
    p = subprocess.run(
        ["bash", "tools/gpu_suite.sh"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert out.count("no GPU") == 1, out[-4000:]
    assert HEADER in out
    assert _row(out, "resident")[-1] == "yes"
    for name in ("ferry-pinned", "ferry-ram", "ferry-disk"):
        cells = _row(out, name)
        assert cells[-1] == "yes", f"{name} differs from resident: {cells}"
        assert float(cells[2]) > 0, cells  # s/step measured
    for name in ("comfy-lowvram", "comfy-lowvram-async"):
        assert f"skipped {name}: FERRY_COMFYUI unset (no ComfyUI)" in out
    for name in ("dyn-resident", "dyn-default", "dyn-ferry-pinned", "dyn-fast-disk"):
        assert f"skipped {name}: FERRY_COMFYUI_DYNAMIC unset (no ComfyUI with dynamic VRAM)" in out
    # The issue-41 rows, at the dry run's size: the RAM tier staged, straight from pageable
    # memory, and pinned (on a CPU all three copy RAM to RAM; the GPU gives the GB/s).
    for name in ("resident", "ferry-block-pinned", "ferry-block-ram", "ferry-block-ram+pageable"):
        cells = _compare_row(out, name)
        assert cells[-1] == "yes", f"{name} differs from resident: {cells}"
        assert float(cells[1]) > 0, cells
    assert "skipped gguf-lora: FERRY_COMFYUI or FERRY_COMFYUI_GGUF unset" in out
    if importlib.util.find_spec("diffusers") is None:
        assert "skipped diffusers-block: diffusers not installed" in out
        assert "skipped diffusers-disk: diffusers not installed" in out
    else:
        assert _row(out, "diffusers-block")[-1] == "yes"
