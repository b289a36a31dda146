"""Keeps the node help pages' input and output tables equal to the locale files.

A help page (web/comfyui/docs/<NodeId>/<lang>.md, which ComfyUI's frontend shows in the
user's language; <NodeId>.md is the English page, its fallback) is written by hand except
for two blocks, which this tool writes from locales/<lang>/nodeDefs.json: every input with
its label and tooltip, and every output. So a tooltip is written once (English: in the node's
Python definition, copied to locales/en/nodeDefs.json by ``python -m tests.node_schemas
--en-locale``; other languages: in their nodeDefs.json) and the page cannot disagree with it.

    python tools/help_pages.py          rewrite the blocks (and <NodeId>.md from en.md)
    python tools/help_pages.py --check  exit 1, naming the pages, where one is stale
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "web" / "comfyui" / "docs"
LOCALES = REPO / "locales"

#: The header of each block's table, per language: (input, label, what it does), (output, …).
HEADERS = {
    "en": (("input", "what it does"), ("output", "what it is")),
    "zh": (("输入", "名称", "作用"), ("输出", "说明")),
    "ja": (("入力", "表示名", "内容"), ("出力", "説明")),
    "ko": (("입력", "표시 이름", "설명"), ("출력", "설명")),
}
BLOCK = re.compile(r"(<!-- ferry:(inputs|outputs) -->\n)[\s\S]*?(<!-- /ferry:\2 -->)")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def blocks(lang: str, node: dict) -> dict[str, str]:
    """The two tables of ``node`` (its nodeDefs.json entry in ``lang``)."""
    (in_head, out_head) = HEADERS[lang]
    inputs = []
    for name, entry in node["inputs"].items():
        label = entry.get("name", name)
        row = (f"`{name}`", entry["tooltip"]) if lang == "en" else (f"`{name}`", label)
        inputs.append(row if lang == "en" else (*row, entry["tooltip"]))
    outputs = [(o["name"], o["tooltip"]) for o in node["outputs"].values()]
    return {"inputs": _table(in_head, inputs), "outputs": _table(out_head, outputs)}


def render(page: str, lang: str, node: dict) -> str:
    """``page`` with its blocks rewritten."""
    tables = blocks(lang, node)
    return BLOCK.sub(lambda m: m.group(1) + tables[m.group(2)] + m.group(3), page)


def pages() -> dict[Path, str]:
    """{path: what it should hold} for every page there is, plus each <NodeId>.md."""
    want: dict[Path, str] = {}
    for lang_dir in sorted(p for p in LOCALES.iterdir() if p.is_dir()):
        lang = lang_dir.name
        defs = json.loads((lang_dir / "nodeDefs.json").read_text(encoding="utf-8"))
        for nid, node in defs.items():
            path = DOCS / nid / f"{lang}.md"
            if path.is_file():
                want[path] = render(path.read_text(encoding="utf-8"), lang, node)
                if lang == "en":
                    want[DOCS / f"{nid}.md"] = want[path]
    return want


def main(argv: list[str]) -> int:
    stale = []
    for path, text in pages().items():
        old = path.read_text(encoding="utf-8") if path.is_file() else None
        if old != text:
            stale.append(path.relative_to(REPO))
            if "--check" not in argv:
                path.write_text(text, encoding="utf-8")
    if stale and "--check" in argv:
        print("stale help pages (run python tools/help_pages.py):", *stale, sep="\n  ")
        return 1
    for p in stale:
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
