"""The node help pages (WEB_DIRECTORY/docs/<NodeId>.md and <NodeId>/<lang>.md, which ComfyUI's
frontend opens from a node): one per node in every shipped language, each with the same
sections, and their input and output tables equal to the locale files (tools/help_pages.py)."""

from __future__ import annotations

import importlib.util
import re

import pytest

from tests import locales
from tests.conftest import REPO
from tests.node_schemas import node_schemas

DOCS = REPO / "web" / "comfyui" / "docs"
TEMPLATES = REPO / "example_workflows"
#: Each page's sections, in order, per language: when, inputs, outputs, example, errors.
SECTIONS = {
    "en": ["When to use it", "Inputs", "Outputs", "Example", "Errors and what to do"],
    "zh": ["何时使用", "输入", "输出", "示例", "错误与处理"],
    "ja": ["使いどころ", "入力", "出力", "例", "エラーと対処"],
    "ko": ["언제 사용하나요", "입력", "출력", "예시", "오류와 해결"],
}
NODES = sorted(node_schemas())


def _tool():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("help_pages", REPO / "tools" / "help_pages.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_pages_sit_where_the_frontend_looks() -> None:
    init = (REPO / "__init__.py").read_text()
    web = re.search(r'WEB_DIRECTORY = "\./([\w/]+)"', init)
    assert web is not None and REPO / web.group(1) / "docs" == DOCS


@pytest.mark.parametrize("lang", locales.LANGUAGES)
@pytest.mark.parametrize("node", NODES)
def test_every_node_has_a_page_in_every_language(node: str, lang: str) -> None:
    page = DOCS / node / f"{lang}.md"
    assert page.is_file(), f"no help page {page.relative_to(REPO)}"
    text = page.read_text(encoding="utf-8")
    heads = re.findall(r"^## (.+)$", text, flags=re.M)
    assert heads == SECTIONS[lang], (page.name, heads)
    title = locales.read(lang, "nodeDefs.json")[node]["display_name"]
    assert text.startswith(f"# {title}"), text.splitlines()[0]
    # Every input is in the page's table by its id (what errors and saved workflows name).
    for inp in node_schemas()[node]["inputs"]:
        assert f"| `{inp['name']}` |" in text, (node, lang, inp["name"])
    # Each template a page points to is shipped.
    for name in re.findall(r"`(\d\d_\w+)`", text):
        assert (TEMPLATES / f"{name}.json").is_file(), (page, name)


def test_the_default_page_is_the_english_one() -> None:
    for node in NODES:
        assert (DOCS / f"{node}.md").read_text() == (DOCS / node / "en.md").read_text(), node


def test_the_tables_are_the_locale_files() -> None:
    # A tooltip changed in nodes/*.py or a nodeDefs.json and not in the pages fails here.
    stale = [p for p, text in _tool().pages().items() if p.read_text(encoding="utf-8") != text]
    assert stale == [], f"run python tools/help_pages.py: {stale}"


def test_the_tool_puts_a_changed_tooltip_in_the_page() -> None:
    tool = _tool()
    node = locales.read("zh", "nodeDefs.json")["FerryOffloadModel"]
    node["inputs"]["tier"]["tooltip"] = "改过的说明"
    page = (DOCS / "FerryOffloadModel" / "zh.md").read_text(encoding="utf-8")
    out = tool.render(page, "zh", node)
    assert "| `tier` | 存放位置 | 改过的说明 |" in out
    assert out.count("<!-- ferry:inputs -->") == 1
