"""The kind table (offload_core/offload_kind.py) is the only place a kind of network is spelled:
its words ("text encoder"), the list of kinds, how often each is read. Every other file of the
pack reads the row (``OffloadKind.TEXT_ENCODER.label``), so a new kind is one row there plus
its site and node file, and no label can drift between the sidebar, the plan and the report.

The scan reads each .py file's syntax tree (not its prose: a tooltip saying "the text encoder"
is a sentence, not a kind's label) and finds the kind contexts that spell a kind again:
- a literal or a call holding a kind (its value "text_encoder", or ``OffloadKind.X``) beside
  a kind's words ("text encoder", "CLIP vision model"): a label table or a site re-wording it;
- a literal holding two or more kinds' values (``("model", "controlnet", ...)``, a
  ``Literal[...]``): a list of kinds, their order or their reads written again.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from offload_core.offload_kind import LISTING_ORDER, OFFLOADED, OffloadKind, parse_kind

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "offload_core" / "offload_kind.py"
VALUES = {k.value for k in OffloadKind}
# "model" is both a value and a label (and a common word): it marks a kind, never a label.
WORDS = {w for k in OffloadKind for w in (k.label, k.noun)} - VALUES


def pack_files() -> list[Path]:
    skip = {"tests", "bench", "docs", "node_modules", "__pycache__"}
    return sorted(
        p
        for p in ROOT.rglob("*.py")
        if p != TABLE
        and not any(part in skip or part.startswith(".") for part in p.relative_to(ROOT).parts)
    )


def _constant(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _is_kind_member(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "OffloadKind"
    )


def _members(node: ast.AST) -> list[ast.AST]:
    """The direct members of a literal or a call: what one table row or one call spells."""
    if isinstance(node, ast.Dict):
        return [n for n in (*node.keys, *node.values) if n is not None]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return list(node.elts)
    if isinstance(node, ast.Call):
        return [*node.args, *(k.value for k in node.keywords)]
    return []


def kind_contexts(source: str) -> list[tuple[int, str]]:
    """(line, what) for each place ``source`` spells a kind again (the module docstring)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        members = _members(node)
        texts = [t for t in map(_constant, members) if t is not None]
        kinds = {t for t in texts if t in VALUES}
        words = sorted({t for t in texts if t in WORDS})
        if words and (kinds or any(_is_kind_member(m) for m in members)):
            found.append((node.lineno, f"a kind beside its words {words}"))  # type: ignore[attr-defined]
        elif len(kinds) >= 2 and not isinstance(node, ast.Call):  # a call's args: its own
            found.append((node.lineno, f"a list of kinds {sorted(kinds)}"))  # type: ignore[attr-defined]
    return found


def test_the_table_is_the_only_place_a_kind_is_spelled() -> None:
    spelled = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in pack_files()
        for line, what in kind_contexts(path.read_text(encoding="utf-8"))
    ]
    assert spelled == [], "read the row of offload_core/offload_kind.py instead:\n" + "\n".join(
        spelled
    )


@pytest.mark.parametrize(
    "source",
    [
        '_KIND_WORDS = {"model": "model", "text_encoder": "text encoder"}',
        'SITE = NetworkSite(OffloadKind.CLIP_VISION, "CLIP vision model", control="clip_vision")',
        'Kind = Literal["model", "text_encoder", "controlnet"]',
        'PER_STEP = ("model", "controlnet", "model_patch")',
    ],
)
def test_the_scan_finds_a_kind_spelled_again(source: str) -> None:
    # Today's code before the table (planner/facts.py, seam/site.py, prompt_networks.py).
    assert kind_contexts(source)


@pytest.mark.parametrize(
    "source",
    [
        'TOOLTIP = "The text encoder (CLIP) to offload."',
        'inputs = ("model", "clip")',
        "TITLE = OffloadKind.TEXT_ENCODER.label",
    ],
)
def test_the_scan_passes_prose_and_reads_of_the_table(source: str) -> None:
    assert kind_contexts(source) == []


def test_each_row_has_its_own_words_and_the_orders_follow_the_table() -> None:
    labels = [k.label for k in OffloadKind]
    assert len(set(labels)) == len(labels)
    assert [k.line_title("x") for k in OffloadKind][:2] == ["model: x", "text encoder: x"]
    assert list(LISTING_ORDER) == list(OffloadKind)
    # A plan lists the kinds every step reads first, then in the table's order (any rows).
    plan = sorted(OffloadKind, key=lambda k: k.plan_order)
    per_step = [k for k in OffloadKind if k.per_step]
    assert plan == per_step + [k for k in OffloadKind if not k.per_step]
    assert plan[:3] == [OffloadKind.MODEL, OffloadKind.CONTROLNET, OffloadKind.MODEL_PATCH]
    assert OffloadKind.VAE not in OFFLOADED
    with pytest.raises(Exception, match="kind: must be one of 'model'"):
        parse_kind("vae")
