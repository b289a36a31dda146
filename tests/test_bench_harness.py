"""What every benchmark driver shares (bench/harness.py, bench/report.py), through the
head-to-head's use of it: its rows run through ``harness.spawn`` with a chosen Python, are
judged byte for byte against their core's resident row, and land in ``report.h2h_table``.
Plus: every bench module imports (a driver run once a month must not find a stale import)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from bench import h2h, harness, report

REPO = Path(__file__).resolve().parents[1]


def test_every_bench_module_imports() -> None:
    names = sorted(p.stem for p in (REPO / "bench").glob("*.py"))
    code = (
        "import importlib, sys\nfor n in sys.argv[1:]:\n    importlib.import_module('bench.' + n)"
    )
    env = {**os.environ, "TORCHAO_FORCE_SKIP_LOADING_SO_FILES": "1", "PYTHONPATH": str(REPO)}
    p = subprocess.run(
        [sys.executable, "-c", code, *names], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr[-3000:]


def _imported_names(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_bench_imports_no_test_module() -> None:
    """A benchmark stands on the pack and bench/, never on a test's helpers (a test module
    renamed would break a driver nobody runs in CI). A driver of the real-ComfyUI harness
    lives beside it in tests/comfyui/ (bench_whole_graph.py)."""
    test_modules = {p.stem for p in (REPO / "tests").rglob("*.py")} - {"__init__"}
    found = {}
    for path in sorted((REPO / "bench").rglob("*.py")):
        bad = {
            n
            for n in _imported_names(path)
            if n.split(".")[0] == "tests" or n in test_modules or n == "conftest"
        }
        if bad:
            found[path.relative_to(REPO).as_posix()] = sorted(bad)
    assert not found, found


def test_worker_env_puts_the_checkout_first_and_keeps_the_callers_path(monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/tmp/ferry-site")
    monkeypatch.setenv("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "0")
    env = harness.worker_env()
    assert env["PYTHONPATH"].split(os.pathsep) == [str(REPO), "/tmp/ferry-site"]
    assert env["TORCHAO_FORCE_SKIP_LOADING_SO_FILES"] == "0"  # the caller's choice stands


def test_a_failed_h2h_row_comes_back_named_with_its_error_and_log(tmp_path: Path) -> None:
    # A job the worker cannot run (no "spec" for the plain backend): the worker's own
    # job_main writes the error; spawn adds what the process printed.
    job = {"row": "ferry-disk", "backend": "plain", "device": "cpu", "cap_bytes": None,
           "result_file": str(tmp_path / "r.json")}  # fmt: skip
    res = harness.spawn("bench.h2h_worker", job, python=sys.executable)
    assert res["row"] == "ferry-disk"
    assert res["error"].strip().splitlines()[-1].startswith("KeyError"), res["error"]
    assert "Traceback" in res["log"]
    assert json.loads(Path(job["result_file"]).read_text())["row"] == "ferry-disk"
    table = report.h2h_table([{**res, "cap": 3 << 30}], None, None)
    line = next(ln for ln in table.splitlines() if ln.startswith("| ferry-disk |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert len(cells) == len(report.H2H_HEAD)
    assert cells[1] == "3.00 GiB" and cells[2].startswith("FAILED: KeyError"), cells


def _row(tmp: Path, row: str, latent: torch.Tensor, s_step: float) -> dict:
    path = tmp / f"{row}.pt"
    torch.save(latent, path)
    return {"row": row, "latent": str(path), "s_step": s_step, "rss_anon": 1 << 30,
            "rss_file": 0, "cap": 1 << 30}  # fmt: skip


def test_h2h_rows_are_judged_against_their_own_cores_resident_row(tmp_path: Path) -> None:
    base = torch.randn(2, 4)
    base[0, 0] = float("nan")  # NaN-safe: equal means the same bytes
    other = base.clone()
    other[1, 1] += 1.0
    results = [
        _row(tmp_path, "dyn-resident", other, 1.0),
        _row(tmp_path, "dyn-ferry-disk", other.clone(), 2.0),
        _row(tmp_path, "resident", base, 0.5),
        _row(tmp_path, "ferry-disk", base.clone(), 1.0),
        _row(tmp_path, "ferry-ram", other.clone(), 1.0),
        _row(tmp_path, "ferry-pinned", base[:1].clone(), 1.0),
    ]
    h2h.judge(results)
    cells = {}
    for ln in report.h2h_table(results, None, 1.0).splitlines():
        c = [x.strip() for x in ln.strip("|").split("|")]
        cells[c[0]] = c
    assert cells["dyn-ferry-disk"][-1] == "yes" and cells["dyn-ferry-disk"][3] == "2.00"
    assert cells["ferry-disk"][-1] == "yes" and cells["ferry-disk"][3] == "2.00"
    assert cells["ferry-ram"][-1].startswith("NO (1.0e+00"), cells["ferry-ram"]
    assert cells["ferry-pinned"][-1] == "NO (shape (1, 4) vs (2, 4))"
    assert cells["resident"][-1] == "yes" and cells["resident"][5] == "1.00 GiB"
