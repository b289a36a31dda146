"""tools/panel.py, the README's main job: starts the panel on the demo model, prints its
URL, binds 127.0.0.1 unless told otherwise, and warns when told otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from ._panel_server import free_port

pytest.importorskip("gradio")
REPO = Path(__file__).resolve().parents[1]


def _start(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    env = dict(
        os.environ, FERRY_SETTINGS=str(tmp_path / "settings.json"), GRADIO_ANALYTICS_ENABLED="False"
    )
    proc = subprocess.Popen(
        [sys.executable, "tools/panel.py", "--no-browser", "--size-gb", "0.002", "--port", str(port), *extra],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    return proc, line.strip()


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    return err


def test_starts_on_loopback_and_prints_its_url(tmp_path: Path) -> None:
    proc, line = _start(tmp_path)
    try:
        assert line.startswith("Ferry panel: http://127.0.0.1:"), line
        url = line.split(": ", 1)[1]
        with urllib.request.urlopen(url, timeout=30) as r:
            assert r.status == 200
    finally:
        err = _stop(proc)
    assert "WARNING" not in err


def test_other_addresses_need_the_flag_and_print_a_warning(tmp_path: Path) -> None:
    proc, line = _start(tmp_path, "--listen", "0.0.0.0")
    try:
        assert line.startswith("Ferry panel: http://"), line
    finally:
        err = _stop(proc)
    assert "WARNING: listening on 0.0.0.0" in err
