"""The one reader of the /ferry/ routes' request bodies: bytes in, a JSON object out, or a
BodyError naming what to change (``setting``: ``body`` for the body as a whole, else the dotted
path of the field, e.g. ``prompt.3.inputs.cfg``).

Not aiohttp's ``request.json()``: Python's json module parses nested arrays and objects by
recursion, so a deeply nested body raised RecursionError (a 500) instead of an answer, and it
takes NaN, Infinity and 1e999 (not JSON; they reached the settings as floats) and raises a bare
ValueError on an integer of more than 4300 digits. Here the nesting is measured before parsing,
and every number is checked after it. No aiohttp: CI tests it directly.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

#: The deepest a body may nest. A queued prompt nests about 8 levels (its UI workflow under
#: extra_data); 64 leaves room for any node's widget values.
MAX_DEPTH = 64
#: Integers beyond this lose precision in the browser's JavaScript (Number.MAX_SAFE_INTEGER),
#: and no Ferry setting comes near it.
MAX_INT = 2**53 - 1

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")


class BodyError(ValueError):
    """The body cannot be used. ``setting`` names what to change; str() says how."""

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(message)
        self.setting = setting


class _NotJsonNumber:
    """A number the body spells that JSON or Python cannot carry; the check below names it."""

    def __init__(self, text: str, fix: str = "send a finite number") -> None:
        self.text = text if len(text) <= 24 else f"{text[:20]}... ({len(text)} characters)"
        self.fix = fix


def _int(text: str) -> int | _NotJsonNumber:
    # Checked on the digits, before int(): int() refuses more than 4300 of them with a bare
    # ValueError, and a number that long is refused anyway.
    if len(text.lstrip("-")) > 16 or abs(int(text)) > MAX_INT:
        return _NotJsonNumber(text, f"send a whole number of at most {MAX_INT}")
    return int(text)


def _float(text: str) -> float | _NotJsonNumber:
    value = float(text)  # 1e999 is a JSON number, but Python reads it as inf
    return value if math.isfinite(value) else _NotJsonNumber(text)


def _too_deep(text: str) -> bool:
    """Whether the body nests deeper than MAX_DEPTH (counting outside strings only)."""
    brackets = _NOT_BRACKETS.sub("", _STRINGS.sub("", text))
    depth = 0
    for c in brackets:
        if c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return True
        else:
            depth -= 1
    return False


def _path(parts: tuple[str, ...]) -> str:
    return ".".join(parts) or "body"


def _check_numbers(value: Any) -> None:
    """Refuses NaN, infinities and too-long numbers, naming the field that holds one."""
    todo: list[tuple[tuple[str, ...], Any]] = [((), value)]
    while todo:
        parts, v = todo.pop()
        if isinstance(v, dict):
            todo.extend(((*parts, str(k)), item) for k, item in v.items())
        elif isinstance(v, list):
            todo.extend(((*parts, str(i)), item) for i, item in enumerate(v))
        elif isinstance(v, _NotJsonNumber):
            where = _path(parts)
            raise BodyError(where, f"{where}: {v.text} is not a number Ferry can take; {v.fix}")


def read_json_object(raw: bytes) -> dict[str, Any]:
    """``raw`` (a request's body) as a JSON object; BodyError names what to change."""
    if not raw.strip():
        raise BodyError("body", "the body is empty; send a JSON object {...}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BodyError(
            "body", f"the body is not UTF-8 (byte {e.start}: {raw[e.start : e.start + 1]!r}); "
            "send JSON encoded as UTF-8",
        ) from None  # fmt: skip
    if _too_deep(text):
        raise BodyError(
            "body", f"the body nests deeper than {MAX_DEPTH} levels of [ ] and {{ }}; send a flatter one"
        )  # fmt: skip
    try:
        value = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_NotJsonNumber)
    except json.JSONDecodeError as e:
        raise BodyError(
            "body", f"the body is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})"
        ) from None
    except RecursionError:  # not reached after _too_deep; kept so no nesting can be a 500
        raise BodyError("body", f"the body nests deeper than {MAX_DEPTH} levels") from None
    if not isinstance(value, dict):
        kind = {list: "an array", str: "a string", bool: "true/false", type(None): "null"}
        got = kind.get(type(value), "a number")
        raise BodyError("body", f"the body must be a JSON object {{...}}, got {got}")
    _check_numbers(value)
    return value
