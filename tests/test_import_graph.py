"""The dependency direction inside offload_core (docs/architecture.md, "Which way imports
point"): every import, at module level, inside a function or under TYPE_CHECKING, points from
a higher layer to a lower one, and no two modules import each other, directly or around a
loop. Read from the source with ``ast``: nothing is imported to check it."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "offload_core"

#: Lowest first. A module may import its own package's modules and any lower layer's.
LAYERS: list[set[str]] = [
    {"errors", "units"},
    {"policy", "offload_kind", "ending"},
    {"control_defaults"},
    {"formats"},
    {"model"},
    {"disk"},
    {"transfer"},
    {"runtime"},
    {"sources"},
    {"quant", "registry", "planner"},
    {"api"},
    {"loader"},
    {"tools"},
    {"__init__"},
]
#: A command line (``python -m offload_core.quant``) is imported by nothing: it sits above
#: every layer, yet belongs to its folder (``test_no_package_cycles``).
ENTRY_POINT = "__main__"


def modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = list(p.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The offload_core modules ``name`` imports (a name imported from a package counts as
    its submodule where one exists)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "offload_core"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").split(".")[0] == "offload_core":
                target = node.module or ""
            else:
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.add(sub if sub in known else target)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports(m, p, known) for m, p in known.items()}


def layer_of(module: str) -> tuple[int, str]:
    parts = module.split(".")
    room = parts[1] if len(parts) > 1 else "__init__"
    if parts[-1] == ENTRY_POINT:
        return len(LAYERS), room
    for i, rooms in enumerate(LAYERS):
        if room in rooms:
            return i, room
    raise AssertionError(f"{module} is in no layer: add its folder to LAYERS and the docs")


def test_the_graph_sees_the_packages() -> None:
    g = graph()
    assert {"offload_core.sources.placement", "offload_core.disk.reader"} <= set(g)
    assert "offload_core.transfer.copies" in g["offload_core.runtime.engine"]


def test_every_import_resolves() -> None:
    """mypy is told to ignore missing imports (torchao, psutil), so a stale relative import
    would pass it: every offload_core module named must exist."""
    known = modules()
    missing = [f"{m} -> {t}" for m, ts in graph().items() for t in ts if t not in known]
    assert not missing, "\n".join(missing)


def test_imports_point_down_the_layers() -> None:
    wrong = []
    for m, targets in graph().items():
        (lm, rm) = layer_of(m)
        for t in targets:
            (lt, rt) = layer_of(t)
            if rt != rm and lt >= lm:
                wrong.append(f"{m} -> {t}")
    assert not wrong, "imports against the direction:\n" + "\n".join(sorted(wrong))


def test_no_module_cycles() -> None:
    g = graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for t in sorted(g.get(m, ())):
            if t.endswith(ENTRY_POINT):
                continue
            if state.get(t) == 1:
                cycles.append([*path[path.index(t) :], t])
            elif t in g and t not in state:
                visit(t)
        path.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m)
    # A package's __init__ re-exporting its own modules is not a cycle of meaning.
    real = [c for c in cycles if not all(m == c[0] or m.startswith(c[0] + ".") for m in c)]
    assert not real, "import cycles:\n" + "\n".join(" -> ".join(c) for c in real)


def test_no_package_cycles() -> None:
    """The same, one folder at a time: a package's modules (its ``__main__`` included) and
    another package's may not import each other. ``python -m offload_core.quant`` importing
    ``tools`` while ``tools`` imports ``quant`` is a loop between two folders even though
    nothing imports ``__main__`` itself."""
    rooms: dict[str, set[str]] = {}
    for m, targets in graph().items():
        rm = layer_of(m)[1]
        for t in targets:
            rt = layer_of(t)[1]
            if rt != rm:
                rooms.setdefault(rm, set()).add(rt)
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(r: str) -> None:
        state[r] = 1
        path.append(r)
        for t in sorted(rooms.get(r, ())):
            if state.get(t) == 1:
                cycles.append([*path[path.index(t) :], t])
            elif t not in state:
                visit(t)
        path.pop()
        state[r] = 2

    for r in sorted(rooms):
        if r not in state:
            visit(r)
    assert not cycles, "package cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)
