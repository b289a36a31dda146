"""The routes' one body reader (nodes/ui/json_body.py): what it refuses, and the field it names."""

from __future__ import annotations

import importlib

import pytest

from tests.conftest import PACK_NAME, load_pack

load_pack()
json_body = importlib.import_module(f"{PACK_NAME}.nodes.ui.json_body")


def refused(raw: bytes) -> tuple[str, str]:
    with pytest.raises(json_body.BodyError) as e:
        json_body.read_json_object(raw)
    return e.value.setting, str(e.value)


def test_a_100k_deep_body_is_refused_before_parsing() -> None:
    # json.loads itself raises RecursionError here (what aiohttp's request.json() let through).
    for raw in (b"[" * 100_000 + b"]" * 100_000, b'{"a": ' * 100_000 + b"1" + b"}" * 100_000):
        setting, text = refused(raw)
        assert setting == "body" and "deeper than 64" in text


def test_64_levels_pass_65_do_not_and_brackets_in_strings_do_not_count() -> None:
    assert json_body.read_json_object(b'{"a": ' + b"[" * 63 + b"]" * 63 + b"}")
    assert refused(b'{"a": ' + b"[" * 64 + b"]" * 64 + b"}")[0] == "body"
    deep_text = '{"a": "' + "[{" * 1000 + '\\" ]"}'
    assert json_body.read_json_object(deep_text.encode()) == {"a": "[{" * 1000 + '" ]'}


@pytest.mark.parametrize(
    ("raw", "setting"),
    [(b'{"vram_gb": NaN}', "vram_gb"), (b'{"policy": {"headroom_gb": -Infinity}}', "policy.headroom_gb"),
     (b'{"prompt": {"3": {"inputs": {"cfg": 1e999}}}}', "prompt.3.inputs.cfg"),
     (b'{"port": ' + b"9" * 5000 + b"}", "port"), (b'{"a": [1, 9007199254740992]}', "a.1")],
)  # fmt: skip
def test_numbers_json_or_python_cannot_carry_name_their_field(raw: bytes, setting: str) -> None:
    got, text = refused(raw)
    assert got == setting and text.startswith(setting)


@pytest.mark.parametrize(
    ("raw", "says"),
    [(b"", "empty"), (b" \n", "empty"), (b'{"a": "\xff"}', "not UTF-8"),
     ('{"a": 1}'.encode("utf-16"), "not UTF-8"), (b'{"a": 1,}', "not valid JSON"),
     (b"[]", "got an array"), (b"null", "got null"), (b'"x"', "got a string"), (b"7", "got a number")],
)  # fmt: skip
def test_what_is_not_a_json_object_names_the_body(raw: bytes, says: str) -> None:
    setting, text = refused(raw)
    assert setting == "body" and says in text


def test_a_good_body_comes_back_as_sent() -> None:
    raw = '{"port": 7861, "x": [1.5, -2, "é", null, true], "big": 9007199254740991}'.encode()
    assert json_body.read_json_object(raw) == {
        "port": 7861, "x": [1.5, -2, "é", None, True], "big": 2**53 - 1,
    }  # fmt: skip
