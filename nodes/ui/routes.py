"""The /ferry/ HTTP routes (also served under /api/ferry/ by ComfyUI): a thin aiohttp adapter
over api.py. Registered from the extension's on_load, never at import."""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from aiohttp import web

from ..patcher.live_layout import release_from_panel
from . import api
from .json_body import BodyError, read_json_object
from .pusher import ensure_pushing

log = logging.getLogger("ferry")
_registered = {"done": False}


def _reply(result: api.Reply) -> web.Response:
    status, body = result
    return web.json_response(body, status=status)


async def _json_body(request: web.Request) -> tuple[Any, web.Response | None]:
    """The body as a JSON object, or the 4xx reply naming what to change (json_body.py)."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as e:
        return None, web.json_response(
            {"error": f"the body is too large: {e.text}", "setting": "body"}, status=413
        )
    try:
        return read_json_object(raw), None
    except BodyError as e:
        return None, web.json_response({"error": str(e), "setting": e.setting}, status=400)


def _is_busy() -> bool:
    import server

    return server.PromptServer.instance.prompt_queue.get_tasks_remaining() > 0


def _plan_prompt(prompt: dict[str, Any]) -> dict[str, Any]:
    from ..planning.auto_settings import budgets, panel_wish
    from ..planning.graph_plan import plan_prompt
    from ..planning.offload_policy import default_disk_path

    plan = plan_prompt(
        prompt, default_folder=default_disk_path(), budgets=budgets(), panel_wish=panel_wish()
    )
    return plan.as_dict()


def register(routes: web.RouteTableDef) -> None:
    """Every /ferry/ route, in one table (registered once per process)."""
    if _registered["done"]:
        return
    _registered["done"] = True

    @routes.get("/ferry/stats")
    async def stats(request: web.Request) -> web.Response:
        ensure_pushing()  # a page asking for stats wants them live
        return _reply(api.get_stats())

    @routes.get("/ferry/settings")
    async def get_settings(request: web.Request) -> web.Response:
        return _reply(api.get_settings())

    @routes.post("/ferry/settings")
    async def post_settings(request: web.Request) -> web.Response:
        body, err = await _json_body(request)
        return err or _reply(api.put_settings(body))

    # The pre-flight (/ferry/plan) and Ferry's budgets (/ferry/budgets).
    @routes.post("/ferry/plan")
    async def plan(request: web.Request) -> web.Response:
        body, err = await _json_body(request)
        if err is not None:
            return err
        loop = asyncio.get_running_loop()  # headers are read from disk: off the event loop
        return _reply(await loop.run_in_executor(None, api.post_plan, body, _plan_prompt))

    @routes.get("/ferry/budgets")
    async def get_budgets(request: web.Request) -> web.Response:
        return _reply(api.get_budgets())

    @routes.post("/ferry/budgets")
    async def post_budgets(request: web.Request) -> web.Response:
        body, err = await _json_body(request)
        return err or _reply(api.put_budgets(body))

    @routes.post("/ferry/panel")
    async def panel(request: web.Request) -> web.Response:
        body, err = await _json_body(request)
        if err is not None:
            return err
        bad = api.panel_body_error(body)  # before gradio's import: a bad body is always a 400
        if bad is not None:
            return _reply(bad)
        try:
            launch = functools.partial(api.panel_launcher(), reapply_hook=release_from_panel)
        except ImportError as e:
            return web.json_response({"error": str(e), "setting": "gradio"}, status=503)
        # Building the Gradio app takes seconds: off the event loop, so ComfyUI stays live.
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(None, api.start_panel, body, launch, _is_busy)
        except Exception as e:
            # A bug while building the panel must reach the button as a readable message,
            # not as aiohttp's bare 500 page; the traceback goes to ComfyUI's log.
            log.exception("ferry: the panel failed to start")
            return web.json_response(
                {"error": f"the panel failed to start: {type(e).__name__}: {e}"}, status=500
            )
        return _reply(result)
