"""Ferry's four POST routes in a real ComfyUI (aiohttp as ComfyUI configures it, under /ferry/
and /api/ferry/): the 200 malformed bodies per route of tests/route_fuzz.py, every one a 4xx
whose JSON names the field to change, and ComfyUI still answering (its own /system_stats and
Ferry's /ferry/settings) after each route's run."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.route_fuzz import PER_ROUTE, ROUTES, check_reply, malformed_bodies


def _post(url: str, body: bytes) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.mark.parametrize("route", ROUTES)
def test_every_malformed_body_gets_a_4xx_naming_the_field(server: Any, route: str) -> None:
    cases = malformed_bodies(route)
    assert len(cases) == PER_ROUTE
    saved = Path(server.base) / "ferry-settings.json"  # FERRY_SETTINGS of this server
    before = saved.read_bytes() if saved.exists() else None
    wrong = []
    for i, case in enumerate(cases):
        prefix = "/api" if i % 2 else ""  # ComfyUI serves every route under /api as well
        status, raw = _post(server.url + prefix + route, case.body)
        problem = check_reply(case, status, raw)
        if problem:
            wrong.append(f"{case.why} ({case.body[:80]!r}...): {problem}")
    with urllib.request.urlopen(server.url + "/system_stats", timeout=30) as r:
        assert r.status == 200 and "system" in json.loads(r.read())
    with urllib.request.urlopen(server.url + "/ferry/settings", timeout=30) as r:
        assert r.status == 200
    after = saved.read_bytes() if saved.exists() else None
    assert after == before, "a malformed body changed the saved settings"
    assert not wrong, (
        f"{len(wrong)} of {len(cases)} bodies to {route}:\n"
        + "\n".join(wrong[:40])
        + "\n"
        + server.log_tail(30)
    )
