"""Malformed bodies for Ferry's four POST routes (/ferry/settings, /ferry/budgets, /ferry/plan,
/ferry/panel), generated from a seed: each must get a 4xx whose JSON names the field to change.

Shared by tests/test_route_fuzz.py (the aiohttp adapter, in CI) and
tests/comfyui/test_comfyui_route_fuzz.py (a real ComfyUI, opt-in). Every body here is wrong:
none may reach the panel's launch or save a setting. Each case carries the names a reply may
give as its ``setting``: the dotted path of the field (``policy.tier``), its last part
(``tier``) or ``body`` when the body as a whole is wrong (empty, not UTF-8, not JSON, too deep,
not an object).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ROUTES = ("/ferry/settings", "/ferry/budgets", "/ferry/plan", "/ferry/panel")
PER_ROUTE = 200
#: Nesting the routes refuse (nodes/ui/json_body.py reads at most 64 levels).
DEPTHS = (65, 100, 1_000, 10_000, 100_000)


@dataclass(frozen=True)
class Case:
    route: str
    body: bytes
    why: str
    #: What the reply's "setting" may be.
    names: frozenset[str]

    def accepts(self, setting: Any) -> bool:
        return isinstance(setting, str) and setting in self.names


def _names(path: str) -> frozenset[str]:
    return frozenset({path, path.rsplit(".", 1)[-1]})


def _dump(value: Any) -> bytes:
    return json.dumps(value).encode()


class _Raw:
    """A JSON text placed as is where a value goes (NaN, 1e999, a 5000-digit number)."""

    def __init__(self, text: str) -> None:
        self.text = text


def _render(value: Any) -> str:
    """json.dumps, except that _Raw values go in verbatim."""
    if isinstance(value, _Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_render(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_render(v) for v in value) + "]"
    return json.dumps(value)


def _deep(rng: random.Random) -> str:
    depth = rng.choice(DEPTHS)
    if rng.random() < 0.5:
        return "[" * depth + "1" + "]" * depth
    return '{"a": ' * depth + "1" + "}" * depth


def _bad_number(rng: random.Random) -> _Raw:
    """Numbers JSON cannot carry or Python cannot hold: NaN, infinities, a literal that
    overflows a float, and integers beyond 2**53 up to thousands of digits."""
    kind = rng.randrange(6)
    if kind == 0:
        return _Raw(rng.choice(["NaN", "Infinity", "-Infinity"]))
    if kind == 1:
        return _Raw(rng.choice(["1e999", "-1e999", "1E400", "2e308"]))
    if kind == 2:
        return _Raw(str(rng.randrange(2**53, 2**64)))
    if kind == 3:
        return _Raw("9" * rng.choice([20, 400, 4_301, 10_000]))
    if kind == 4:
        return _Raw("-" + "9" * rng.choice([17, 5_000]))
    return _Raw("1" + "0" * rng.choice([310, 1_000]) + ".5")


def _wrong_type(rng: random.Random) -> Any:
    return rng.choice([[], [1, 2], {}, {"x": 1}, [[["deep"]]], {"a": {"b": []}}])


def _unknown_field(rng: random.Random) -> str:
    return rng.choice(["colour", "Port", "tier ", "__proto__", "x" * 300, "пароль", "a.b", ""])


def _body_level(route: str, rng: random.Random, example: dict[str, Any]) -> Case:
    """What is wrong with the body as a whole, whatever the route."""
    kind = rng.randrange(8)
    body = frozenset({"body"})
    if kind == 0:
        return Case(route, rng.choice([b"", b" ", b"\n\t ", b"\r\n"]), "empty", body)
    if kind == 1:
        text = json.dumps(example)
        bad = rng.choice(
            [
                text.encode("utf-16"),
                text.replace("}", ', "k": "caf\u00e9"}').encode("latin-1"),
                text.encode()[:-1] + b"\xff}",
                b"\xef\xbb\xbf" + text.encode()[:1] + b"\xc3\x28" + text.encode()[1:],
                b"\x80" + text.encode(),
            ]
        )
        return Case(route, bad, "not UTF-8", body)
    if kind == 2:
        text = json.dumps(example)
        bad_text = rng.choice(
            [
                text[: rng.randrange(1, max(2, len(text)))],
                text[:-1] + ",}",
                text.replace('"', "'"),
                "{port: 1}",
                text + " // comment",
                text + text,
                "{" * rng.randrange(1, 40),
                "[1, 2",
                "nul",
                "{}}",
                '{"a" 1}',
            ]
        )
        return Case(route, bad_text.encode(), f"not JSON: {bad_text[:40]!r}", body)
    if kind == 3:
        return Case(route, _deep(rng).encode(), "nested too deep", body)
    if kind == 4:
        inner = _deep(rng)
        field = rng.choice(sorted(example) or ["x"])
        return Case(route, f'{{"{field}": {inner}}}'.encode(), "a field nested too deep", body)
    if kind == 5:
        top = rng.choice(["[]", "[{}]", '"text"', "1", "true", "false", "null", "1.5", "-0"])
        return Case(route, top.encode(), f"top level {top}", body)
    if kind == 6:
        return Case(route, ("[" + json.dumps(example) + "]").encode(), "an array of the body", body)
    number = _bad_number(rng)
    return Case(route, number.text.encode(), "a bare number", body)


def _settings(rng: random.Random) -> Case:
    route = "/ferry/settings"
    kind = rng.randrange(7)
    policy_keys = ["level", "blocks_per_group", "tier", "prefetch_depth", "vram_budget_gb",
                   "headroom_gb", "bake_lora", "disk_path", "direct_io", "verify", "cpu_read"]  # fmt: skip
    if kind == 0:
        key = rng.choice(policy_keys)
        value = rng.choice([_bad_number(rng), _wrong_type(rng)])
        body = {"policy": {key: value}}
        return Case(route, _render(body).encode(), f"policy.{key} wrong", _names(f"policy.{key}"))
    if kind == 1:
        bad = rng.choice(
            [
                ("tier", "tape"),
                ("level", "node"),
                ("prefetch_depth", 0),
                ("prefetch_depth", -3),
                ("blocks_per_group", 0),
                ("bake_lora", "sometimes"),
                ("headroom_gb", -1),
                ("tier", 3),
            ]
        )
        body = {"policy": {bad[0]: bad[1]}}
        return Case(route, _dump(body), f"policy {bad}", _names(f"policy.{bad[0]}"))
    if kind == 2:
        value = rng.choice([5, True, [], {}, "int3", "", None, _bad_number(rng)])
        body = {"policy": {}, "quant_preset": value}
        return Case(route, _render(body).encode(), "quant_preset wrong", _names("quant_preset"))
    if kind == 3:
        field = _unknown_field(rng)
        body = {"policy": {}, field: 1} if rng.random() < 0.5 else {"policy": {field: 1}}
        path = field if field in body else f"policy.{field}"
        return Case(route, _dump(body), f"unknown {field!r}", frozenset({field, path}))
    if kind == 4:
        value = rng.choice([_wrong_type(rng), "block", 7, True, _bad_number(rng)])
        if isinstance(value, dict):
            value = [value]
        body = {"policy": value}
        return Case(route, _render(body).encode(), "policy not an object", _names("policy"))
    if kind == 5:
        field = rng.choice(["vram_gb", "ram_gb"])
        value = rng.choice([-1, "lots", [], True, _bad_number(rng), 1e308])
        body = {"policy": {}, "budgets": {field: value}}
        return Case(route, _render(body).encode(), f"budgets.{field}", _names(f"budgets.{field}"))
    return _body_level(route, rng, {"policy": {"tier": "ram"}, "quant_preset": "none"})


def _budgets(rng: random.Random) -> Case:
    route = "/ferry/budgets"
    kind = rng.randrange(4)
    field = rng.choice(["vram_gb", "ram_gb"])
    if kind == 0:
        value = rng.choice([-1, -0.5, "-2", "lots", "1e999", "nan", "inf", "16 GB!", True, False])
        return Case(route, _dump({field: value}), f"{field}={value!r}", _names(field))
    if kind == 1:
        value = rng.choice([_bad_number(rng), _wrong_type(rng), _Raw("1e308"), _Raw("1.7e308")])
        return Case(route, _render({field: value}).encode(), f"{field} bad number/type", _names(field))  # fmt: skip
    if kind == 2:
        unknown = _unknown_field(rng)
        return Case(route, _dump({field: 1, unknown: 2}), f"unknown {unknown!r}", _names(unknown))
    return _body_level(route, rng, {"vram_gb": 8, "ram_gb": None})


def _plan(rng: random.Random) -> Case:
    route = "/ferry/plan"
    queued = rng.random() < 0.5
    prefix = "prompt." if queued else ""

    def wrap(prompt: Any) -> Any:
        return {"prompt": prompt, "client_id": "fuzz"} if queued else prompt

    kind = rng.randrange(6)
    if kind == 0:
        node = rng.choice([[], "UNETLoader", 3, None, True, [{"class_type": "X"}]])
        body = wrap({"1": node})
        return Case(route, _dump(body), "a node not an object", _names(f"{prefix}1"))
    if kind == 1:
        node: dict[str, Any] = rng.choice(
            [
                {"inputs": {}},
                {"class_type": 5, "inputs": {}},
                {"class_type": None, "inputs": {}},
                {"class_type": ["UNETLoader"], "inputs": {}},
                {"class_type": "", "inputs": {}},
                {"class_type": "UNETLoader", "inputs": []},
                {"class_type": "UNETLoader", "inputs": "unet_name=m"},
                {"class_type": "UNETLoader", "inputs": 1},
            ]
        )
        field = "class_type" if "inputs" not in node or node.get("class_type") != "UNETLoader" else "inputs"  # fmt: skip
        body = wrap({"1": node})
        return Case(route, _dump(body), f"node {node}", _names(f"{prefix}1.{field}"))
    if kind == 2:
        number = _bad_number(rng)
        body = wrap({"3": {"class_type": "KSampler", "inputs": {"cfg": number, "steps": 20}}})
        return Case(route, _render(body).encode(), "a bad number in an input", _names(f"{prefix}3.inputs.cfg"))  # fmt: skip
    if kind == 3:
        prompt = rng.choice([[], "workflow", 7, {}, None, [{"1": {}}]])
        body = {"prompt": prompt} if queued else prompt
        return Case(route, _dump(body), f"prompt {prompt!r}", frozenset({"prompt", "body"}))
    if kind == 4:
        inner = _deep(rng)
        text = '{"1": {"class_type": "KSampler", "inputs": {"seed": ' + inner + "}}}"
        if queued:
            text = '{"prompt": ' + text + "}"
        return Case(route, text.encode(), "an input nested too deep", frozenset({"body"}))
    return _body_level(route, rng, {"prompt": {"1": {"class_type": "UNETLoader", "inputs": {}}}})


def _panel(rng: random.Random) -> Case:
    route = "/ferry/panel"
    kind = rng.randrange(4)
    if kind == 0:
        value = rng.choice([0, -1, 65536, 1 << 20, "7861", "", True, False, 7861.5, 7861.0])
        return Case(route, _dump({"port": value}), f"port={value!r}", _names("port"))
    if kind == 1:
        value = rng.choice([_bad_number(rng), _wrong_type(rng)])
        return Case(route, _render({"port": value}).encode(), "port bad number/type", _names("port"))  # fmt: skip
    if kind == 2:
        field = rng.choice(["host", "listen", "share", "auth", _unknown_field(rng)])
        return Case(route, _dump({field: "0.0.0.0"}), f"unknown {field!r}", _names(field))
    return _body_level(route, rng, {"port": 7861})


def check_reply(case: Case, status: int, raw: bytes) -> str | None:
    """None when the reply is a 4xx naming one of the case's fields, else what is wrong."""
    try:
        reply = json.loads(raw)
    except ValueError:
        return f"{status}, not JSON: {raw[:200]!r}"
    if not 400 <= status < 500:
        return f"{status}: {reply}"
    if not isinstance(reply, dict) or not isinstance(reply.get("error"), str):
        return f"{status} without an error text: {reply}"
    if not case.accepts(reply.get("setting")):
        return f"{status} names {reply.get('setting')!r}, not one of {sorted(case.names)}: {reply['error']}"  # fmt: skip
    return None


MAKERS: dict[str, Callable[[random.Random], Case]] = {
    "/ferry/settings": _settings,
    "/ferry/budgets": _budgets,
    "/ferry/plan": _plan,
    "/ferry/panel": _panel,
}


def malformed_bodies(route: str, n: int = PER_ROUTE, seed: int = 50) -> list[Case]:
    """``n`` malformed bodies for ``route``, the same ones for the same seed."""
    rng = random.Random(f"{seed}:{route}")
    return [MAKERS[route](rng) for _ in range(n)]
