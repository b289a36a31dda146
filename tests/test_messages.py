"""Every message a node, the sidebar or the panel shows names a widget, a node, a file or a
folder; none names a Python call (issue 12).

- nodes/ and web/ (the nodes, the panel, the sidebar's JS): no string a user can read holds a
  Python call (``handle.remove()``, ``find_offload(``, ``torch.no_grad()``).
- offload_core/ is also a Python API: a Python call may appear only where nodes can never show
  it: in an ``ApiUseError`` (nodes/patcher/recovery.py ``for_node`` says it in ComfyUI's words
  instead), in a ConfigError about an argument only Python callers pass (nodes pass their own
  factories and callbacks), and in the command-line tools' help.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.conftest import PACK_NAME, load_pack
from tests.source_scan import docstring_ids

ROOT = Path(__file__).resolve().parents[1]
# A name called: "remove()", "handle.remove()", "find_offload(model", "torch.device('meta')";
# not "group(s)" / "file(s)".
CALL = re.compile(r"\b[A-Za-z_][\w.]*\((?!s\))")
CSS_FUNCTIONS = ("rgba(", "rgb(", "var(", "calc(", "url(", "hsl(", "hsla(")
PYTHON_ARGUMENTS = {"build", "progress", "converts"}  # ConfigError settings no node has
CLI = {"offload_core/quant/__main__.py", "offload_core/tools/demo.py", "offload_core/tools/autotune.py"}  # fmt: skip

load_pack()
errors = importlib.import_module(f"{PACK_NAME}.offload_core.errors")
recovery = importlib.import_module(f"{PACK_NAME}.nodes.patcher.recovery")
oc = importlib.import_module(f"{PACK_NAME}.offload_core")


def python_call(text: str) -> str | None:
    for c in CSS_FUNCTIONS:
        text = text.replace(c, "")
    m = CALL.search(text)
    return m.group(0) if m and " " in text else None  # a message has words; a key has none


def python_strings(path: Path) -> list[tuple[int, str, ast.AST | None]]:
    """(line, text, the call it is an argument of) for every string but docstrings."""
    tree = ast.parse(path.read_text())
    docs, parent = docstring_ids(tree), {}
    for n in ast.walk(tree):
        for child in ast.iter_child_nodes(n):
            parent[id(child)] = n
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            up = parent.get(id(n))
            while up is not None and not isinstance(up, (ast.Call, ast.stmt)):
                up = parent.get(id(up))
            out.append((n.lineno, n.value, up if isinstance(up, ast.Call) else None))
    return out


def _files(folder: str, suffix: str) -> list[Path]:
    return sorted((ROOT / folder).rglob(f"*{suffix}"))


def test_the_scan_finds_a_python_call() -> None:
    assert python_call("the layout is kept; call handle.remove() first") == "handle.remove("
    assert python_call("use offload_core.find_offload(model) to") == "offload_core.find_offload("
    assert python_call("the weights of 2 group(s) (blocks.0) were lost") is None
    assert python_call("torch.compile") is None  # a key, not a message


@pytest.mark.parametrize("folder", ["nodes", "web"])
def test_nodes_and_panel_strings_name_no_python_call(folder: str) -> None:
    found = [
        f"{p.relative_to(ROOT)}:{line}: {text!r}"
        for p in _files(folder, ".py")
        for line, text, _ in python_strings(p)
        if python_call(text)
    ]
    assert found == []


def js_strings(text: str) -> list[str]:
    """The string literals of a JS file, template literals without their ${...} code."""
    lit = re.compile(r"""'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"|`(?:[^`\\]|\\.)*`""")
    text = re.sub(r"^\s*//.*$", "", text, flags=re.M)
    return [re.sub(r"\$\{[^{}]*(\{[^{}]*\}[^{}]*)*\}", "", m.group(0)[1:-1]) for m in lit.finditer(text)]  # fmt: skip


def test_sidebar_strings_name_no_python_call() -> None:
    files = _files("web", ".js")
    assert files, "the sidebar's JS moved"
    assert "ferry.stats" in js_strings(files[0].read_text())  # the scan reads strings
    found = [f"{p.name}: {s!r}" for p in files for s in js_strings(p.read_text()) if python_call(s)]
    assert found == []


def _allowed(path: str, call: ast.AST | None) -> bool:
    if path in CLI:
        return True
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        return False
    cls = getattr(errors, call.func.id, None)
    if isinstance(cls, type) and issubclass(cls, errors.ApiUseError):
        return True
    first = call.args[0] if call.args else None
    return (
        isinstance(cls, type)
        and issubclass(cls, errors.ConfigError)
        and isinstance(first, ast.Constant)
        and first.value in PYTHON_ARGUMENTS
    )


def test_offload_core_names_python_calls_only_where_nodes_never_show_them() -> None:
    found, allowed = [], 0
    for p in _files("offload_core", ".py"):
        rel = str(p.relative_to(ROOT))
        for line, text, call in python_strings(p):
            if python_call(text):
                if _allowed(rel, call):
                    allowed += 1
                else:
                    found.append(f"{rel}:{line}: {text!r}")
    assert found == []
    assert allowed >= 3, "the allowed cases are still found (the scan sees raise sites)"


def _grad_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)))


def _real_api_errors() -> list[BaseException]:
    """AlreadyOffloadedError and InferenceOnlyError as offload_core raises them."""
    model = _grad_model()
    policy = oc.OffloadPolicy(level=oc.LeafLevel(), tier=oc.RamTier())
    handle = oc.apply_offload(model, policy, onload_device="cpu")
    out = []
    for attempt in (
        lambda: oc.apply_offload(model, policy, onload_device="cpu"),
        lambda: model(torch.ones(1, 8)),  # autograd on, parameters require grad
    ):
        with pytest.raises(errors.ApiUseError) as e:
            attempt()
        out.append(e.value)
    handle.remove()
    return out


def test_nodes_say_an_api_use_error_in_comfyui_words() -> None:
    errs = _real_api_errors()
    assert [type(e).__name__ for e in errs] == ["AlreadyOffloadedError", "InferenceOnlyError"]
    assert all(python_call(str(e)) for e in errs), "these are the Python hints nodes translate"
    errs.append(errors.ApiUseError("the handle was removed: call apply_offload() again"))
    for err in errs:

        def executor(*args: object, err: BaseException = err) -> None:
            raise err

        with pytest.raises(errors.FerryError) as shown:
            recovery.guard(executor)
        msg = str(shown.value)
        assert msg.startswith("Ferry Offload Model"), msg
        assert python_call(msg) is None, msg
