"""No module of Ferry calls a platform-specific function outside the platform backends
(offload_core/disk/posix.py, offload_core/disk/portable.py): ``os.preadv``, ``os.pread``,
``os.O_DIRECT``, ``mmap.MADV_*`` (and ``madvise``), ``resource``, ``fcntl``, ``os.kill``
(on Windows it terminates the process it names). Read from the source, so a new call
anywhere in the pack fails here before it crashes a Windows or macOS user."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACK_DIRS = ["offload_core", "nodes", "web", "webui", "scripts", "tools", "seam"]
# files.py chooses between the two by whether os.preadv exists.
BACKENDS = {REPO / f"offload_core/disk/{n}.py" for n in ("posix", "portable", "files")}
OS_CALLS = {"preadv", "pread", "pwritev", "pwrite", "O_DIRECT", "posix_fadvise", "kill"}
MODULES = {"resource", "fcntl"}


def _pack_files() -> list[Path]:
    return sorted(p for d in PACK_DIRS if (REPO / d).is_dir() for p in (REPO / d).rglob("*.py"))


def platform_calls(path: Path) -> list[str]:
    """Each platform-specific use in ``path``: 'line: what'."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        what = None
        if isinstance(node, ast.Attribute) and node.attr == "madvise":
            what = ".madvise"
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner, attr = node.value.id, node.attr
            if owner == "os" and attr in OS_CALLS:
                what = f"os.{attr}"
            elif owner == "mmap" and attr.startswith("MADV_"):
                what = f"mmap.{attr}"
            elif owner in MODULES:
                what = f"{owner}.{attr}"
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] in MODULES]
            what = f"import {', '.join(names)}" if names else None
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in MODULES:
            what = f"from {node.module} import"
        elif isinstance(node, ast.Constant) and _names_a_call(node.value):
            what = f"{node.value!r}"
        if what is not None:
            found.append(f"{node.lineno}: {what}")
    return found


def _names_a_call(value: object) -> bool:
    """getattr(mmap, "MADV_...") and getattr(os, "preadv") spell the call as a string."""
    return isinstance(value, str) and (
        value.startswith("MADV_") or value in {"preadv", "pread", "O_DIRECT"}
    )


@pytest.mark.parametrize("path", _pack_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_platform_call_outside_the_backends(path: Path) -> None:
    calls = platform_calls(path)
    if path in BACKENDS:
        return
    assert not calls, (
        f"{path.relative_to(REPO)} calls platform-specific functions ({'; '.join(calls)}): "
        "put them in offload_core/disk/posix.py and portable.py behind disk/files.py"
    )


def test_the_scan_finds_what_it_looks_for() -> None:
    """The checker itself: the backends do use these calls, so it sees them there."""
    posix = platform_calls(REPO / "offload_core/disk/posix.py")
    for what in ("os.preadv", "os.O_DIRECT", "mmap.MADV_DONTNEED", ".madvise", "import resource"):
        assert any(what in c for c in posix), (what, posix)
