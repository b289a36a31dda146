"""locales/: every language Ferry ships names every node, input, output, sidebar word and
setting the code has; English node text is the Python definitions' own (one source)."""

from __future__ import annotations

import re

import pytest

from tests import locales
from tests.conftest import REPO
from tests.node_schemas import en_node_defs, node_schemas

FERRY_JS = REPO / "web" / "comfyui" / "ferry.js"
#: The sidebar's code: ferry.js, the plan section it draws (ferry_plan.js, handed its t()) and
#: the drawing helpers both use (ferry_dom.js), and its "Use Ferry's loader" row (ferry_swap.js).
SIDEBAR_JS = (
    FERRY_JS,
    *(
        REPO / "web" / "comfyui" / f
        for f in ("ferry_plan.js", "ferry_dom.js", "ferry_pictures.js", "ferry_swap.js")
    ),
)
#: Words a translation keeps as they are (units, formats, names of things).
TERMS = ("VRAM", "GiB", "GB/s", "LoRA", "GGUF", "O_DIRECT", "torchao", "CUDA", "UNETLoader")
PLACEHOLDER = re.compile(r"\{(\w+)\}")


def test_ferry_ships_the_four_languages() -> None:
    assert set(locales.LANGUAGES) <= set(locales.languages())


def test_english_node_text_is_the_python_definitions() -> None:
    # The tooltips live in nodes/*.py; locales/en/nodeDefs.json is written from them by
    # `python -m tests.node_schemas --en-locale` and must not drift.
    want = en_node_defs(node_schemas())
    got = locales.read("en", "nodeDefs.json")
    assert got == want, (
        "locales/en/nodeDefs.json is stale: run python -m tests.node_schemas --en-locale"
    )


@pytest.mark.parametrize("name", ["nodeDefs.json", "main.json", "settings.json"])
@pytest.mark.parametrize("lang", [lang for lang in locales.LANGUAGES if lang != "en"])
def test_each_language_has_every_english_key(lang: str, name: str) -> None:
    en = locales.leaves(locales.read("en", name))
    got = locales.leaves(locales.read(lang, name))
    assert en, f"locales/en/{name} is empty"
    missing = sorted(set(en) - set(got))
    extra = sorted(set(got) - set(en))
    assert not missing and not extra, f"{lang}/{name}: missing {missing}, not in en {extra}"
    for key, text in got.items():
        assert isinstance(text, str) and text.strip(), (lang, name, key)
        # The same {placeholders} as English, and the technical terms kept.
        assert set(PLACEHOLDER.findall(text)) == set(PLACEHOLDER.findall(en[key])), (lang, key)
        for term in TERMS:
            if term in en[key] and not key.endswith(".name"):
                assert term in text, (lang, key, term)


@pytest.mark.parametrize("lang", [lang for lang in locales.LANGUAGES if lang != "en"])
def test_node_names_and_tooltips_are_translated(lang: str) -> None:
    en = locales.read("en", "nodeDefs.json")
    got = locales.read(lang, "nodeDefs.json")
    for nid, node in got.items():
        assert node["display_name"] != en[nid]["display_name"], (lang, nid)
        assert node["display_name"].startswith("Ferry"), (lang, nid)  # the brand stays
        for name, inp in node["inputs"].items():
            assert inp["tooltip"] != en[nid]["inputs"][name]["tooltip"], (lang, nid, name)


def _sidebar_keys_used() -> set[str]:
    code = "".join(p.read_text() for p in SIDEBAR_JS)
    return set(re.findall(r"\bt\(\"(\w+)\"", code))


def test_every_sidebar_word_the_code_uses_exists_and_every_one_is_used() -> None:
    used = _sidebar_keys_used()
    assert len(used) > 20  # the parse found the calls
    for lang in locales.LANGUAGES:
        words = locales.read(lang, "main.json")["ferry"]["sidebar"]
        assert used <= set(words), (lang, sorted(used - set(words)))
    unused = set(locales.read("en", "main.json")["ferry"]["sidebar"]) - used
    assert not unused, f"locales/en/main.json has words ferry.js never shows: {sorted(unused)}"


def test_the_sidebar_has_no_english_literals_left() -> None:
    # Shown text goes through t(); what is left in quotes is CSS, ids, routes and units.
    text = "".join(p.read_text() for p in SIDEBAR_JS)
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//"))
    code = re.sub(r"const STYLE = `[\s\S]*?`;", "", code)
    sentences = re.findall(r"[\"'`]([A-Z][a-z]+(?: [A-Za-z→]+)+)", code)
    assert sentences == [], sentences


def test_every_setting_the_sidebar_declares_is_translated() -> None:
    ids = re.findall(r"const SETTING_\w+ = \"([\w.]+)\"", FERRY_JS.read_text())
    assert len(ids) == 2
    for lang in locales.LANGUAGES:
        settings = locales.read(lang, "settings.json")
        for sid in ids:
            # The frontend looks a setting up by its id with dots turned into underscores.
            entry = settings[sid.replace(".", "_")]
            assert entry["name"] and entry["tooltip"], (lang, sid)
