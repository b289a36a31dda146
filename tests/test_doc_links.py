"""Every relative link and picture in the README and the pages under docs/ leads somewhere: the
file exists in the repository, and an anchor (``page.md#section``, ``#section``) names a
heading of that page as GitHub makes its anchors."""

from __future__ import annotations

import re

from tests.conftest import REPO
from tests.readme_docs import (
    README,
    anchors,
    doc_pages,
    is_relative,
    links,
    reachable_from_readme,
)


def _broken() -> list[str]:
    broken = []
    for page in doc_pages():
        where = page.relative_to(REPO)
        for target in links(page):
            if not is_relative(target):
                continue
            path_part, _, anchor = target.partition("#")
            path = (page.parent / path_part).resolve() if path_part else page
            if not path.exists():
                broken.append(f"{where}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{where}: {target} (no heading makes #{anchor} there)")
    return broken


def test_every_relative_link_resolves() -> None:
    broken = _broken()
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_readme_links_every_page_under_docs() -> None:
    """A page under docs/ that nothing leads to is lost to a reader."""
    reached = set(reachable_from_readme())
    orphans = [
        str(p.relative_to(REPO))
        for p in doc_pages()
        if p not in reached and p.parent.name == "docs"
    ]
    assert not orphans, f"pages no link from the README leads to: {orphans}"


def test_pyprojects_links_into_the_readme_name_its_headings() -> None:
    """pyproject.toml's URLs (the Registry shows them) may point at a README section."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    wanted = re.findall(r'"https://github\.com/ferry-offload/ferry#([^"]+)"', text)
    lost = [a for a in wanted if a not in anchors(README)]
    assert not lost, f"pyproject.toml links README anchors no heading makes: {lost}"
