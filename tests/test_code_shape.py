"""Code shape: a file past 400 lines, a function past 50 lines or a class past 15 methods (in
the hosts and the seam) is a prompt to look, not an order to split. Either it does two jobs
and is split by job, or its job is one and it is named below with the reason it stays whole.
A split made only to pass a number (two halves that read only together, a helper that takes
its caller's locals as tuples) is worse than the long whole it came from.

Also the import directions between the hosts and the seam (real rules, no exceptions)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("offload_core", "nodes", "web", "webui", "seam")
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 50
#: The host folders and the seam, where each class is one job: at most this many methods.
CLASS_PACKAGES = ("seam", "nodes", "webui")
MAX_CLASS_METHODS = 15

#: Past a cap and whole on purpose: ``path:qualified.name`` for a function or class, ``path``
#: for a file -> why it reads best whole. Keep the list short and each reason a sentence.
WHOLE: dict[str, str] = {
    "offload_core/policy.py": (
        "what a user asks for, whole: the typed policy (with the planner's VRAM share), every "
        "setting's type and its one parser, which every host, the panel and the settings file "
        "share; the disk tier's choices as literals and planned_vram took it past 400"
    ),
    "nodes/ui/routes.py:register": (
        "the route table: one short handler per /ferry/ route, read as one list (it was split "
        "in two only to stay under 50 lines)"
    ),
    "offload_core/quant/loader.py:load_quantized": (
        "a long docstring (every argument) over one path: check every setting, then the "
        "cache or the quantizer and its cache entry (the quantize-and-save half took its "
        "caller's locals as tuples)"
    ),
}


def python_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _defs(tree: ast.Module) -> list[tuple[str, ast.AST]]:
    """Every function and class in ``tree``, by qualified name (``Engine.__init__``,
    ``register.plan``)."""
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    out: list[tuple[str, ast.AST]] = []
    for node in ast.walk(tree):
        if isinstance(node, _DEFS):
            names, up = [node.name], parent.get(node)
            while up is not None:
                if isinstance(up, _DEFS):
                    names.append(up.name)
                up = parent.get(up)
            out.append((".".join(reversed(names)), node))
    return out


def sizes(path: Path, root: Path = REPO) -> dict[str, tuple[int, int]]:
    """What in ``path`` is past its cap: ``path`` or ``path:qualified.name`` -> (size, cap).
    Classes are counted only in CLASS_PACKAGES (the methods in their own body)."""
    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(root).as_posix()
    out: dict[str, tuple[int, int]] = {}
    if len(text.splitlines()) > MAX_FILE_LINES:
        out[rel] = (len(text.splitlines()), MAX_FILE_LINES)
    counts_classes = rel.split("/")[0] in CLASS_PACKAGES
    for name, node in _defs(ast.parse(text, filename=str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            if n > MAX_FUNCTION_LINES:
                out[f"{rel}:{name}"] = (n, MAX_FUNCTION_LINES)
        elif isinstance(node, ast.ClassDef) and counts_classes:
            n = sum(isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for f in node.body)
            if n > MAX_CLASS_METHODS:
                out[f"{rel}:{name}"] = (n, MAX_CLASS_METHODS)
    return out


def past_caps() -> dict[str, tuple[int, int]]:
    return {k: v for path in python_files() for k, v in sizes(path).items()}


def test_the_walk_sees_the_packages() -> None:
    # Guards against a test that passes because it looked at nothing.
    names = {p.relative_to(REPO).as_posix() for p in python_files()}
    assert {"offload_core/api.py", "nodes/offload_node.py", "web/panel/forms.py"} <= names


def test_whatever_is_past_a_cap_is_named_whole_with_its_reason() -> None:
    past = sorted(past_caps().items())
    unnamed = [f"{k} ({n}, cap {cap})" for k, (n, cap) in past if k not in WHOLE]
    assert not unnamed, (
        "past a cap: split each by job where it does two, or name it in WHOLE with the reason "
        "its job is one:\n" + "\n".join(unnamed)
    )


def test_every_name_in_whole_is_still_past_its_cap() -> None:
    """A name that no longer needs its exception (split by job since, or shorter) leaves
    the list, so the list stays the short one that prompts a look."""
    stale = sorted(set(WHOLE) - set(past_caps()))
    assert not stale, "no longer past a cap: remove from WHOLE:\n" + "\n".join(stale)
    assert all(reason.strip() for reason in WHOLE.values())


def test_the_count_sees_a_long_function_and_a_big_class(tmp_path: Path) -> None:
    # Guards against a count that passes because it counted nothing.
    body = "".join(f"    def m{i}(self): ...\n" for i in range(MAX_CLASS_METHODS + 1))
    long = "def long():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    (tmp_path / "seam").mkdir()
    big = tmp_path / "seam" / "big.py"
    nested = "def outer():\n" + "".join("    " + line + "\n" for line in long.splitlines())
    big.write_text(f"class Big:\n{body}\nclass Small:\n    def m(self): ...\n{long}{nested}")
    assert sizes(big, tmp_path) == {
        "seam/big.py:Big": (MAX_CLASS_METHODS + 1, MAX_CLASS_METHODS),
        "seam/big.py:long": (MAX_FUNCTION_LINES + 1, MAX_FUNCTION_LINES),
        "seam/big.py:outer": (MAX_FUNCTION_LINES + 2, MAX_FUNCTION_LINES),
        "seam/big.py:outer.long": (MAX_FUNCTION_LINES + 1, MAX_FUNCTION_LINES),
    }
    elsewhere = tmp_path / "offload_core" / "big.py"  # classes are counted in the hosts only
    elsewhere.parent.mkdir()
    elsewhere.write_text(big.read_text() + "\n" * MAX_FILE_LINES)
    assert "offload_core/big.py" in sizes(elsewhere, tmp_path)
    assert "offload_core/big.py:Big" not in sizes(elsewhere, tmp_path)


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
