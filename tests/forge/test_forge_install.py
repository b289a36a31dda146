"""install.py in Forge: Forge's own extension installer runs it in Forge's Python, where every
package Ferry needs is present: nothing is installed, nothing is printed, no package changes."""

from __future__ import annotations

import subprocess

from forge_server import REPO, forge_checkout


def _freeze(py: str) -> str:
    return subprocess.run(
        [py, "-m", "pip", "freeze", "--disable-pip-version-check"],
        capture_output=True, text=True, check=True, timeout=300,
    ).stdout  # fmt: skip


def test_forges_installer_runs_install_py_and_nothing_changes() -> None:
    forge, py = forge_checkout()
    before = _freeze(py)
    code = (
        "import sys; sys.argv[1:] = []\n"
        "from modules import launch_utils\n"
        f"launch_utils.run_extension_installer({str(REPO)!r})\n"
        "print('installer done')\n"
    )
    r = subprocess.run(
        [py, "-c", code], cwd=forge, capture_output=True, text=True, check=True, timeout=600
    )
    assert r.stdout.strip().splitlines()[-1] == "installer done", r.stdout + r.stderr
    assert "Ferry" not in r.stdout and "Error running install.py" not in r.stdout + r.stderr
    assert _freeze(py) == before
