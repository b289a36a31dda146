"""Ferry's four POST routes through their real aiohttp adapter (nodes/ui/routes.py on an aiohttp
server on 127.0.0.1, bodies sent as raw bytes): 200 malformed bodies per route (tests/route_fuzz.py,
seeded), every one a 4xx whose JSON names the field to change, and the server still answering
after each route's run. tests/comfyui/test_comfyui_route_fuzz.py sends the same bodies to a real
ComfyUI."""

from __future__ import annotations

import asyncio
import http.client
import importlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PACK_NAME, load_pack
from tests.route_fuzz import PER_ROUTE, ROUTES, check_reply, malformed_bodies

web = pytest.importorskip("aiohttp.web", reason="aiohttp is not installed (requirements-dev.txt)")


class Server:
    """An aiohttp application with Ferry's routes, served from a thread of its own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        self._ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        load_pack()
        routes_module = importlib.import_module(f"{PACK_NAME}.nodes.ui.routes")
        table = web.RouteTableDef()
        routes_module._registered["done"] = False  # a fresh table for this application
        routes_module.register(table)
        app = web.Application()  # aiohttp's own body limit (1 MiB), as ComfyUI sets its own
        app.add_routes(table)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def start(self) -> None:
        self._thread.start()
        assert self._ready.wait(60), "the aiohttp server did not start"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(method, path, body=body, headers=headers)
            reply = conn.getresponse()
            return reply.status, reply.read()
        finally:
            conn.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    mp = pytest.MonkeyPatch()
    # Nothing here may save a setting or start the panel: a body that gets that far is a bug.
    mp.setenv("FERRY_SETTINGS", str(tmp_path_factory.mktemp("fuzz") / "settings.json"))
    load_pack()
    api = importlib.import_module(f"{PACK_NAME}.nodes.ui.api")

    def no_launch() -> Any:
        def launch(*args: Any, **kwargs: Any) -> str:
            raise AssertionError(f"a malformed body reached the panel's launch: {args} {kwargs}")

        return launch

    mp.setattr(api, "panel_launcher", no_launch)
    srv = Server()
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
        mp.undo()


@pytest.mark.parametrize("route", ROUTES)
def test_every_malformed_body_gets_a_4xx_naming_the_field(server: Server, route: str) -> None:
    cases = malformed_bodies(route)
    assert len(cases) == PER_ROUTE
    saved = Path(os.environ["FERRY_SETTINGS"])
    wrong = []
    for case in cases:
        status, raw = server.request("POST", route, case.body)
        problem = check_reply(case, status, raw)
        if saved.exists():
            problem = f"{problem or status}; and it saved the settings: {saved.read_text()}"
            saved.unlink()
        if problem:
            wrong.append(f"{case.why} ({case.body[:80]!r}...): {problem}")
    # The server still answers.
    status, raw = server.request("GET", "/ferry/settings")
    assert status == 200 and json.loads(raw)["error"] is None, raw
    assert not wrong, f"{len(wrong)} of {len(cases)} bodies to {route}:\n" + "\n".join(wrong[:40])


def test_the_fuzz_bodies_cover_every_kind_of_bad_body() -> None:
    """The generator's spread: each route gets deep nesting, bad numbers, wrong types or
    unknown fields, a non-object top level, non-UTF-8 and empty bodies."""
    for route in ROUTES:
        bodies = [c.body for c in malformed_bodies(route)]
        assert any(b.startswith(b"[" * 100_000) or b.count(b'{"a": ') >= 100_000 for b in bodies)
        assert any(b"NaN" in b or b"Infinity" in b for b in bodies), route
        assert any(b"1e999" in b or b"9" * 400 in b for b in bodies), route
        assert any(not b.strip() for b in bodies), route
        assert any(b in (b"[]", b"null", b"1", b'"text"', b"true") for b in bodies), route

        def not_utf8(b: bytes) -> bool:
            try:
                b.decode("utf-8")
            except UnicodeDecodeError:
                return True
            return False

        assert any(not_utf8(b) for b in bodies), route
        assert len(set(bodies)) > PER_ROUTE // 3, route  # varied, not one body repeated
