"""The pack's locale files (locales/<lang>/*.json) as ComfyUI serves them, for the tests.

Core (app/custom_node_manager.py, the same in v0.3.64, v0.8.0 and v0.33.0) answers GET /i18n
with {lang: {**main.json, "nodeDefs": …, "commands": …, "settings": …}} merged over every pack;
``served()`` builds the same for this pack alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import REPO

LOCALES = REPO / "locales"
#: The files core reads from a language folder (main.json's keys go to the top level).
FILES = ("main.json", "nodeDefs.json", "settings.json", "commands.json")
#: The languages Ferry ships; en is the base every other is checked against.
LANGUAGES = ("en", "zh", "ja", "ko")


def languages() -> list[str]:
    return sorted(p.name for p in LOCALES.iterdir() if p.is_dir())


def read(lang: str, name: str) -> dict[str, Any]:
    path = LOCALES / lang / name
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def served() -> dict[str, dict[str, Any]]:
    """What GET /i18n answers for this pack: main.json plus each other file under its stem."""
    out: dict[str, dict[str, Any]] = {}
    for lang in languages():
        entry = read(lang, "main.json")
        for name in FILES[1:]:
            data = read(lang, name)
            if data:
                entry[Path(name).stem] = data
        out[lang] = entry
    return out


def leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"a.b.c": value} for every non-dict value of a nested dict."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for k, v in tree.items():
        out.update(leaves(v, f"{prefix}.{k}" if prefix else str(k)))
    return out
