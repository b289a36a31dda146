"""Units as offload_core/units.py names them, checked in the source: a memory amount a user
sees is formatted by ``units.fmt_bytes`` (B, KiB, MiB, GiB, TiB), a rate is in GB/s. Read
with ``ast``, so a new byte formatter, a module's own GB constant, a decimal GB of memory or
a "GB" a user reads fails here:

- a string a user can read (a widget's label or info, a node's tooltip, an error, a table's
  column, a command line's help: every string constant but a docstring, and every string in
  the browser's JavaScript) that writes "GB" other than "GB/s": memory is written "GiB";

- an f-string that divides (or shifts) a number and writes a byte unit after it, other than
  a rate's "GB/s", is a byte formatter of its own;
- a name ``GB``, ``GIB``, ``MB``, ``MIB``, ``KB``, ``KIB``, ``TB`` or ``TIB`` is assigned only
  in units.py (``GB = float(1 << 30)`` in a panel module is another "GB");
- ``1e9`` (or ``10**9``, ``1_000_000_000``) appears only in units.py: a rate divides by
  ``units.GB`` (or calls ``units.gbps``), a memory amount by ``units.GIB``;
- ``units.GB`` itself is used for rates only: an amount divided by it that is not already
  per second (``size / GB``), or a size in GB multiplied by it (``size_gb * GB``), is a
  memory amount in decimal GB (a rate in GB/s times ``GB`` is bytes per second: allowed).
"""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

from tests.source_scan import docstring_ids

REPO = Path(__file__).resolve().parents[1]
SCANNED = ["offload_core", "nodes", "web", "webui", "bench", "scripts", "tools", "seam"]
UNITS = REPO / "offload_core" / "units.py"
UNIT_NAMES = {"GB", "GIB", "GiB", "MB", "MIB", "MiB", "KB", "KIB", "KiB", "TB", "TIB", "TiB"}
#: Text right after a formatted number that names a byte unit (not a rate: "GB/s").
BYTE_UNIT_AFTER = re.compile(r"^\s*\**\s*(?:[KMGT]i?B|bytes?)\b(?!/s)")
DECIMAL_GB = {"1e9", "1e+9", "10**9", "1_000_000_000", "1000000000"}
#: Known exceptions, each with its reason.
KNOWN: set[tuple[str, str]] = set()


#: "GB" as a word, not a rate's "GB/s" nor part of a name (``vram_budget_gb``, ``--size-gb``).
GB_WORD = re.compile(r"(?<![\w/.-])GB\b(?!/s)")
#: A JavaScript line's strings (quoted or template), its comments left out.
JS_STRING = re.compile(r"""(["'`])((?:\\.|(?!\1).)*)\1""")


def _files() -> list[Path]:
    out = [p for d in SCANNED if (REPO / d).is_dir() for p in (REPO / d).rglob("*.py")]
    return sorted(p for p in [*out, *REPO.glob("*.py")] if p != UNITS)


def _divides(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Div, ast.FloorDiv, ast.RShift))
        for n in ast.walk(node)
    )


def _is_gb(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "GB") or (
        isinstance(node, ast.Attribute) and node.attr == "GB"
    )


def _per_second(src: str, node: ast.AST) -> bool:
    """An amount already divided by a duration, or a rate by its name (``raw_gbps``)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return True
    text = (ast.get_source_segment(src, node) or "").lower()
    return "gbps" in text or "rate" in text


def _decimal_gb_amount(src: str, node: ast.BinOp) -> bool:
    """``amount / GB`` or ``size * GB`` with no duration in sight: memory in decimal GB."""
    if isinstance(node.op, ast.Div) and _is_gb(node.right):
        return not _per_second(src, node.left)
    if isinstance(node.op, ast.Mult) and (_is_gb(node.left) or _is_gb(node.right)):
        other = node.right if _is_gb(node.left) else node.left
        return not _per_second(src, other)
    return False


def unit_uses(path: Path) -> list[tuple[int, str]]:
    """Each use in ``path`` that units.py should own: (line, what)."""
    src = path.read_text(encoding="utf-8")
    found = []
    for node in ast.walk(ast.parse(src, str(path))):
        if isinstance(node, ast.JoinedStr):
            parts = node.values
            for value, after in itertools.pairwise(parts):
                if (
                    isinstance(value, ast.FormattedValue)
                    and isinstance(after, ast.Constant)
                    and isinstance(after.value, str)
                    and _divides(value.value)
                    and BYTE_UNIT_AFTER.match(after.value)
                ):
                    found.append((node.lineno, "a byte formatter of its own"))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name) and t.id in UNIT_NAMES:
                    found.append((node.lineno, f"its own unit {t.id}"))
        if isinstance(node, (ast.Constant, ast.BinOp)):
            text = (ast.get_source_segment(src, node) or "").replace(" ", "")
            if text in DECIMAL_GB:
                found.append((node.lineno, f"decimal GB {text}"))
        if isinstance(node, ast.BinOp) and _decimal_gb_amount(src, node):
            found.append((node.lineno, "a memory amount in decimal GB"))
    return found


def gb_shown(path: Path) -> list[tuple[int, str]]:
    """Each string in ``path`` a user reads that writes a memory amount's unit as "GB"."""
    src = path.read_text(encoding="utf-8")
    if path.suffix == ".js":
        return [
            (i, m.group(2))
            for i, line in enumerate(src.splitlines(), 1)
            if not line.lstrip().startswith("//")
            for m in JS_STRING.finditer(line)
            if GB_WORD.search(m.group(2))
        ]
    tree = ast.parse(src, str(path))
    docs = docstring_ids(tree)
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and id(n) not in docs
        and GB_WORD.search(n.value)
    ]


def test_the_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "GB = float(1 << 30)\n"
        "def size(n):\n"
        "    return f'{n / GB:.2f} GB'\n"
        "def free(n):\n"
        "    return f'only {n / 1e9:.1f} GB free'\n"
        "def rate(n, s):\n"
        "    return f'{n / s / GB:.2f} GB/s'\n"
        "def lost(t, size):\n"
        "    return t / (size / GB)\n"
        "def from_cli(size_gb, raw_gbps):\n"
        "    return int(size_gb * GB), raw_gbps * GB\n"
    )
    assert sorted(w for _, w in unit_uses(bad)) == sorted([
        "its own unit GB",
        "a byte formatter of its own",
        "a byte formatter of its own",
        "decimal GB 1e9",
        "a memory amount in decimal GB",  # n / GB, the byte formatter's own amount
        "a memory amount in decimal GB",  # t / (size / GB)
        "a memory amount in decimal GB",  # size_gb * GB (raw_gbps * GB is a rate: not found)
    ])  # fmt: skip


def test_every_byte_amount_goes_through_units() -> None:
    wrong = [
        f"{p.relative_to(REPO)}:{line}: {what}"
        for p in _files()
        for line, what in unit_uses(p)
        if (p.relative_to(REPO).as_posix(), what) not in KNOWN
    ]
    assert not wrong, (
        "format bytes with units.fmt_bytes, rates in GB/s with units.GB:\n" + "\n".join(wrong)
    )


def test_the_label_scan_finds_a_gb_a_user_reads(tmp_path: Path) -> None:
    shown = tmp_path / "view.py"
    shown.write_text(
        '"""A docstring may say what a GB was."""\n'
        "import gradio as gr\n"
        "def view():\n"
        '    gr.Textbox(label="VRAM budget (GB)", elem_id="vram_budget_gb")\n'
        '    gr.Number(label="Headroom (GiB)", info="read at 3.1 GB/s")\n'
        '    raise ValueError(f"{7} GB is less than one byte")\n'
        "TOOLTIP = 'a number of GB (e.g. 6)'\n"
        "FLAG = '--size-gb'\n"
    )
    assert sorted(line for line, _ in gb_shown(shown)) == [4, 6, 7]
    js = tmp_path / "panel.js"
    js.write_text(
        "// a comment may say GB\n"
        "el.title = `peak VRAM ${n} GB`;\n"
        'rate.textContent = `${g} GB/s`; size.textContent = "3 GiB";\n'
    )
    assert [line for line, _ in gb_shown(js)] == [2]


def test_no_gb_a_user_reads() -> None:
    """Every label, tooltip, message and column a user reads writes memory in GiB."""
    js = sorted((REPO / "web").rglob("*.js"))
    wrong = [
        f"{p.relative_to(REPO)}:{line}: {text!r}"
        for p in [*_files(), *js]
        for line, text in gb_shown(p)
    ]
    assert not wrong, "write a memory amount in GiB (units.py), a rate in GB/s:\n" + "\n".join(
        wrong
    )
