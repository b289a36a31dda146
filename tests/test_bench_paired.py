"""The paired benchmark (bench/paired.py) on the demo DiT: every Ferry mode's output equals
resident, and the table it prints carries one row per mode with a measured ratio, the raw
cold read of the same files and the limit, max(resident, raw read)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_paired_runs_and_prints_one_row_per_mode(tmp_path):
    out = tmp_path / "paired.md"
    env = {**os.environ, "TORCHAO_FORCE_SKIP_LOADING_SO_FILES": "1"}
    cmd = [
        sys.executable, "-m", "bench.paired", "--model", "dit", "--size-gb", "0.01",
        "--tokens", "16", "--rounds", "2", "--device", "cpu",
        "--modes", "ferry-block-disk,ferry-block-disk+mapped,ferry-leaf-disk",
        "--workdir", str(tmp_path / "work"), "--out", str(out),
    ]  # fmt: skip
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines() if line.startswith("| ")]
    by_mode = {cells[0].strip(): cells for cells in rows}
    assert set(by_mode) >= {"resident", "ferry-block-disk", "ferry-block-disk+mapped"}
    assert float(by_mode["raw cold read of the same files"][1]) > 0.0
    assert float(by_mode["limit = max(resident, raw read)"][2]) >= 1.0
    for mode in ("ferry-block-disk", "ferry-block-disk+mapped", "ferry-leaf-disk"):
        cells = by_mode[mode]
        assert cells[-2].strip() == "yes", cells
        assert " / " in cells[-1], cells  # reading / stalled (x forward)
        assert float(cells[2]) > 0.0 and float(cells[4]) > 0.0  # x resident, x limit
        assert "(" in cells[5], cells  # in-read GB/s (x raw read)
    assert "round 2/2" in r.stdout
    assert not list((tmp_path / "work").glob("ferry/ferry-*")), "Ferry's group files removed"


def test_paired_refuses_unknown_modes_before_any_work(tmp_path):
    cmd = [sys.executable, "-m", "bench.paired", "--modes", "ferry-block-tape"]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unknown mode" in r.stderr
