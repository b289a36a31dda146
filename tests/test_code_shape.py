"""Code shape: no file over 400 lines and no function over 50 lines in offload_core/, nodes/, webui/
and web/, so each file stays one readable stage and each function one step."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("offload_core", "nodes", "web", "webui", "seam")
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


def _imports(path: Path) -> set[str]:
    """Every module a file imports, relative ones as written (``..nodes.patcher.live_layout``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            out.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_the_two_hosts_never_import_each_other() -> None:
    """nodes/ (ComfyUI) and webui/ (Forge) share offload_core and the panel, nothing else."""
    for host, other in (("nodes", "webui"), ("webui", "nodes")):
        files = sorted((REPO / host).rglob("*.py"))
        assert files
        for path in files:
            bad = [m for m in _imports(path) if m.lstrip(".").split(".")[0] == other]
            assert not bad, f"{path.relative_to(REPO)} imports {bad}"
    webui_imports = {m for p in (REPO / "webui").rglob("*.py") for m in _imports(p)}
    assert not any(m.split(".")[0] == "comfy" for m in webui_imports)


#: What a host imports that the host-neutral layer must not (ComfyUI's, Forge's, Gradio).
HOST_MODULES = {"comfy", "comfy_api", "comfy_execution", "folder_paths", "server", "modules",
                "backend", "gradio", "nodes", "webui", "web"}  # fmt: skip


def test_the_seam_imports_no_host() -> None:
    """seam/ is what both hosts share: it imports offload_core and the standard library only."""
    files = sorted((REPO / "seam").rglob("*.py"))
    assert files
    for path in files:
        bad = [m for m in _imports(path) if m.lstrip(".").split(".")[0] in HOST_MODULES]
        assert not bad, f"{path.relative_to(REPO)} imports {bad}"


#: The host folders and the seam, where each class is one job: at most this many methods.
CLASS_PACKAGES = ("seam", "nodes", "webui")
MAX_CLASS_METHODS = 15


def many_method_classes(path: Path, root: Path = REPO) -> list[str]:
    """Classes of ``path`` defining more than MAX_CLASS_METHODS methods in their own body
    (nested classes count on their own), named relative to ``root``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.ClassDef):
            n = sum(isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for f in node.body)
            if n > MAX_CLASS_METHODS:
                out.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({n} methods)")
    return out


def test_no_class_over_15_methods_in_the_hosts_and_the_seam() -> None:
    files = sorted(p for pkg in CLASS_PACKAGES for p in (REPO / pkg).rglob("*.py"))
    assert files
    offenders = [c for path in files for c in many_method_classes(path)]
    assert not offenders, "split these classes:\n" + "\n".join(offenders)


def test_the_class_count_sees_a_big_class(tmp_path: Path) -> None:
    # Guards against a count that passes because it counted nothing.
    body = "".join(f"    def m{i}(self): ...\n" for i in range(MAX_CLASS_METHODS + 1))
    big = tmp_path / "big.py"
    small = "    def m(self): ...\n"
    big.write_text(f"class Big:\n{body}\nclass Small:\n{small}", encoding="utf-8")
    assert many_method_classes(big, tmp_path) == ["big.py:1 Big (16 methods)"]
