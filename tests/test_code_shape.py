"""Code shape: no file over 400 lines and no function over 50 lines in offload_core/, nodes/
and web/, so each file stays one readable stage and each function one step."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("offload_core", "nodes", "web")
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 50


def python_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            if n > MAX_FUNCTION_LINES:
                out.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_the_walk_sees_the_packages() -> None:
    # Guards against a test that passes because it looked at nothing.
    names = {p.relative_to(REPO).as_posix() for p in python_files()}
    assert {"offload_core/api.py", "nodes/offload_node.py", "web/panel/forms.py"} <= names


def test_no_file_over_400_lines() -> None:
    offenders = []
    for path in python_files():
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > MAX_FILE_LINES:
            offenders.append(f"{path.relative_to(REPO)} ({n} lines)")
    assert not offenders, "split these files:\n" + "\n".join(offenders)


def test_no_function_over_50_lines() -> None:
    offenders = [f for path in python_files() for f in long_functions(path)]
    assert not offenders, "split these functions:\n" + "\n".join(offenders)
