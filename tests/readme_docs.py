"""Reading the README and the pages under docs/ as GitHub shows them: their relative links
(code left out), the anchors their headings make, and which pages a reader reaches from the
README by following links. Shared by tests/test_readme_sections.py and tests/test_doc_links.py."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"

_FENCE = re.compile(r"^ {0,3}```.*?^ {0,3}```", re.S | re.M)
_INDENTED_CODE = re.compile(r"^(?: {4}|\t).*$", re.M)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
#: [text](target) and ![alt](target); the target ends at the first space or closing parenthesis.
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def doc_pages() -> list[Path]:
    """The README and every Markdown page under docs/ (not its images' folder)."""
    return [README, *sorted(DOCS.glob("*.md"))]


def prose(text: str) -> str:
    """``text`` without code: fenced blocks, indented blocks and inline code spans."""
    return _INLINE_CODE.sub("", _INDENTED_CODE.sub("", _FENCE.sub("", text)))


def links(page: Path) -> list[str]:
    """Every link and image target written in ``page``'s prose, as written."""
    return _LINK.findall(prose(page.read_text(encoding="utf-8")))


def is_relative(target: str) -> bool:
    return not re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) and not target.startswith("//")


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped (word characters,
    hyphens and spaces kept), each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors ``page``'s headings make (a repeated heading gets -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    for heading in _HEADING.findall(text):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def reachable_from_readme() -> list[Path]:
    """The README and every Markdown page a reader reaches from it through relative links."""
    found = [README]
    todo = [README]
    while todo:
        page = todo.pop()
        for target in links(page):
            if not is_relative(target):
                continue
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if path.suffix == ".md" and path.is_file() and path not in found:
                found.append(path)
                todo.append(path)
    return found


def flat(text: str) -> str:
    """``text`` with every run of whitespace one space (a term may wrap across lines)."""
    return " ".join(text.split())
