"""The disk tier is one folder (offload_core/disk/): no module outside it opens a file to
write, writes, renames, deletes, fsyncs or maps a file itself, nor spells the name of a group
file or of Ferry's folder's marker. Elsewhere a file is written through ``disk.durable``'s
``atomic_write`` (the quantized cache, the settings file) and Ferry's folder through
``disk.store``'s ``GroupStore``. Read from the source with ``ast``, as test_code_shape.py and
test_platform_calls.py do, so a new call anywhere in the pack fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACK_DIRS = ("offload_core", "nodes", "web", "webui", "seam", "scripts", "tools")
DISK = REPO / "offload_core" / "disk"

#: os functions that write, rename, delete or make a write durable.
OS_WRITES = {"fsync", "fdatasync", "replace", "rename", "renames", "remove", "unlink", "open",
             "truncate", "ftruncate", "write", "pwrite", "pwritev"}  # fmt: skip
#: Path methods that write, rename or delete (``replace`` is left out: str has one too).
PATH_WRITES = {"write_bytes", "write_text", "unlink", "rmdir", "rename", "touch"}
SHUTIL_WRITES = {"rmtree", "move", "copyfile", "copy", "copy2", "copytree"}
#: Ferry's own names on disk: group-00000.safetensors(.tmp), the folder's marker and probe.
DISK_NAMES = re.compile(r"group-(\d|\{\}).*\.safetensors|\.ferry-owned|\.ferry-probe")


def _pack_files() -> list[Path]:
    return sorted(p for d in PACK_DIRS if (REPO / d).is_dir() for p in (REPO / d).rglob("*.py"))


def _text(node: ast.AST) -> str | None:
    """A string constant, or an f-string with ``{}`` for each formatted value."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(v) or "{}" for v in node.values)
    return None


def _writes_mode(call: ast.Call) -> bool:
    """``open(path, "w"...)``: a mode that writes, appends or creates."""
    mode = call.args[1] if len(call.args) > 1 else None
    mode = mode or next((k.value for k in call.keywords if k.arg == "mode"), None)
    text = _text(mode) if mode is not None else None
    return text is not None and any(c in text for c in "wax+")


def _maps_a_file(call: ast.Call) -> bool:
    """``mmap.mmap(fd, ...)``: an anonymous mapping (fd -1) maps no file."""
    first = call.args[0] if call.args else None
    return not (
        isinstance(first, ast.UnaryOp)
        and isinstance(first.operand, ast.Constant)
        and first.operand.value == 1
    )


def disk_work(source: str) -> list[str]:
    """Each place ``source`` does the disk tier's work itself: 'line: what'."""
    tree = ast.parse(source)
    # A docstring or comment-like string may name the files; only code that uses the name counts.
    prose = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    found = []
    for node in ast.walk(tree):
        what = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
            attr = node.func.attr
            if owner == "os" and attr in OS_WRITES:
                what = f"os.{attr}"
            elif owner == "shutil" and attr in SHUTIL_WRITES:
                what = f"shutil.{attr}"
            elif owner == "mmap" and attr == "mmap" and _maps_a_file(node):
                what = "mmap.mmap of a file"
            elif attr in PATH_WRITES:
                what = f".{attr}()"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "open" and _writes_mode(node):
                what = "open() to write"
            elif node.func.id == "fsync_dir":
                what = "fsync_dir"
        elif isinstance(node, ast.ImportFrom) and any(a.name == "fsync_dir" for a in node.names):
            what = "imports fsync_dir"
        elif isinstance(node, (ast.Constant, ast.JoinedStr)) and id(node) not in prose:
            text = _text(node)
            if text is not None and DISK_NAMES.search(text):
                what = f"names {text!r}"
        if what is not None:
            found.append(f"{node.lineno}: {what}")
    return found


def test_the_check_finds_each_kind_of_disk_work() -> None:
    """Guards against a check that passes because it recognises nothing."""
    samples = {
        "os.fsync(fd)": "os.fsync",
        "os.replace(a, b)": "os.replace",
        "fd = os.open(p, os.O_WRONLY)": "os.open",
        "Path(p).write_bytes(b)": ".write_bytes()",
        "p.unlink(missing_ok=True)": ".unlink()",
        "with open(p, 'wb') as f: pass": "open() to write",
        "with open(p, mode='r+b') as f: pass": "open() to write",
        "m = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)": "mmap.mmap of a file",
        "fsync_dir(folder)": "fsync_dir",
        "shutil.rmtree(folder)": "shutil.rmtree",
        "name = f'group-{i:05d}.safetensors'": "names",
        "m = folder / '.ferry-owned'": "names",
    }
    for source, kind in samples.items():
        found = disk_work(source)
        assert found and kind in found[0], (source, found)
    harmless = ("open(p, 'rb')", "mmap.mmap(-1, 4096)", "s.replace('a', 'b')", "x = 'group'",
                '"""Writes group-00000.safetensors and .ferry-owned."""')  # fmt: skip
    for source in harmless:
        assert disk_work(source) == [], source


def test_the_walk_sees_the_pack() -> None:
    names = {p.relative_to(REPO).as_posix() for p in _pack_files()}
    assert {
        "offload_core/disk/store.py",
        "offload_core/quant/cache.py",
        "nodes/planning/config.py",
    } <= names


def test_the_disk_tier_does_its_own_work() -> None:
    """The checks see the disk tier's own calls where they belong."""
    assert any("os.replace" in w for w in disk_work((DISK / "durable.py").read_text()))
    assert any("mmap.mmap" in w for w in disk_work((DISK / "mappings.py").read_text()))
    assert any("names" in w for w in disk_work((DISK / "store.py").read_text()))


def test_no_module_outside_disk_writes_maps_or_fsyncs_a_file() -> None:
    offenders = []
    for path in _pack_files():
        if path.is_relative_to(DISK):
            continue
        for w in disk_work(path.read_text(encoding="utf-8")):
            offenders.append(f"{path.relative_to(REPO)}:{w}")
    assert not offenders, (
        "the disk tier's work outside offload_core/disk/ (write through disk.durable's "
        "atomic_write, or add the verb to the disk tier):\n" + "\n".join(offenders)
    )
