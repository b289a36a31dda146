"""What the /ferry/ routes do, as plain functions returning (HTTP status, JSON body).

No aiohttp and no ComfyUI here (routes.py is the thin adapter), so CI tests every branch:
each bad request gets a 4xx whose body names the field to fix.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...offload_core.errors import ConfigError
from ...offload_core.tools.monitor import get_monitor
from ...offload_core.tools.settings_file import (
    Budgets,
    PanelSettings,
    default_settings_path,
    known_quant_presets,
    load_settings,
    save_budgets,
    save_settings,
)
from ..input_error import NodeInputError
from .stats import current_offloads, fresh_sample, observe_prompt, running_prompt_id, stats_payload

Reply = tuple[int, dict[str, Any]]


def get_stats() -> Reply:
    device = get_monitor().device
    offloads = current_offloads()
    observe_prompt(running_prompt_id(), offloads)
    return 200, stats_payload(fresh_sample(device), offloads, device)


def get_settings(path: str | Path | None = None) -> Reply:
    p = Path(path) if path is not None else default_settings_path()
    body: dict[str, Any] = {"path": str(p), "presets": list(known_quant_presets())}
    try:
        body["settings"] = load_settings(p).to_dict()
        body["error"] = None
    except ConfigError as e:
        # The file is there but broken: show why, and the defaults the form can start from.
        body["settings"] = PanelSettings().to_dict()
        body["error"] = str(e)
        body["setting"] = e.setting
    return 200, body


def put_settings(body: Any, path: str | Path | None = None) -> Reply:
    if not isinstance(body, dict):
        return 400, {
            "error": "send a JSON object {policy: {...}, quant_preset: ...}",
            "setting": "body",
        }
    try:
        settings = PanelSettings.from_dict(body)
        written = save_settings(settings, path)
    except ConfigError as e:
        return 400, {"error": str(e), "setting": e.setting}
    return 200, {"path": str(written), "settings": settings.to_dict(), "error": None}


def post_plan(body: Any, plan: Callable[[dict[str, Any]], dict[str, Any]]) -> Reply:
    """The pre-flight: ``body`` is the workflow in API format, or the payload the frontend
    queues (``{"prompt": {...}, ...}``); ``plan`` plans it (headers only, no weight)."""
    queued = isinstance(body, dict) and "prompt" in body
    prompt = body["prompt"] if queued else body
    bad = _workflow_error(prompt, "prompt." if queued else "")
    if bad is not None:
        return bad
    try:
        return 200, plan(prompt)
    except ConfigError as e:
        return 400, {"error": str(e), "setting": e.setting}
    except NodeInputError as e:  # a Ferry node's widget, named with its node
        return 400, {"error": str(e), "setting": e.input_name}


def _workflow_error(prompt: Any, prefix: str) -> Reply | None:
    """A 400 naming the first field that keeps ``prompt`` from being a workflow in API format
    ({node id: {class_type, inputs}}); None when it is one."""
    if not isinstance(prompt, dict) or not prompt:
        return 400, {
            "error": "send the workflow in API format: {node id: {class_type, inputs}}, "
            'or the queued payload {"prompt": {...}}',
            "setting": "prompt",
        }
    for node_id, node in prompt.items():
        where = f"{prefix}{node_id}"
        if not isinstance(node, dict):
            return 400, {
                "error": f"{where}: a node is a JSON object {{class_type, inputs}}, got {node!r:.60}",
                "setting": where,
            }  # fmt: skip
        class_type = node.get("class_type")
        if not isinstance(class_type, str) or not class_type:
            # A frontend sends a node it could not build (a missing node type, or one its
            # widgets failed on: v0.3.64's frontend and a VAELoader) without its type name.
            hint = (
                "; the frontend could not build this node: fix or replace it on the canvas"
                if class_type is None
                else ""
            )
            return 400, {
                "error": f"{where}.class_type: must be a node's type name, got {class_type!r:.60}{hint}",
                "setting": f"{where}.class_type",
            }  # fmt: skip
        if not isinstance(node.get("inputs"), dict):
            return 400, {
                "error": f"{where}.inputs: must be a JSON object of the node's inputs, "
                f"got {node.get('inputs')!r:.60}",
                "setting": f"{where}.inputs",
            }
    return None


def get_budgets(path: str | Path | None = None) -> Reply:
    try:
        budgets = load_settings(path).budgets or Budgets()
    except ConfigError as e:
        return 200, {"budgets": Budgets().to_dict(), "error": str(e), "setting": e.setting}
    return 200, {"budgets": budgets.to_dict(), "error": None}


def put_budgets(body: Any, path: str | Path | None = None) -> Reply:
    """Sets Ferry's VRAM and RAM budgets (``{"vram_gb": 10, "ram_gb": null}``: empty or 0 is
    no cap) in the settings file; the next prompt plans with them, no restart."""
    try:
        saved = save_budgets(Budgets.from_dict(body), path)
    except ConfigError as e:
        return 400, {"error": str(e), "setting": e.setting}
    return 200, {"budgets": (saved.budgets or Budgets()).to_dict(), "error": None}


def panel_body_error(body: Any) -> Reply | None:
    """A 400 naming what is wrong with a /ferry/panel body ({} or {"port": n}); None if nothing."""
    if body is None:
        return None
    if not isinstance(body, dict):
        return 400, {"error": 'send a JSON object, e.g. {} or {"port": 7861}', "setting": "body"}
    unknown = set(body) - {"port"}
    if unknown:
        return 400, {
            "error": f"unknown field {sorted(unknown)[0]!r}; known: ['port']",
            "setting": sorted(unknown)[0],
        }
    port = body.get("port")
    if port is not None and (
        isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536
    ):
        return 400, {"error": f"port must be 1..65535 or absent, got {port!r:.60}", "setting": "port"}  # fmt: skip
    return None


def start_panel(body: Any, launch: Callable[..., str], is_busy: Callable[[], bool] | None) -> Reply:
    """Starts the Gradio panel on 127.0.0.1 (optionally on ``{"port": n}``); returns its URL."""
    bad = panel_body_error(body)
    if bad is not None:
        return bad
    port = (body or {}).get("port")
    try:
        url = launch("127.0.0.1", port, is_busy=is_busy)
    except ConfigError as e:
        return 400, {"error": str(e), "setting": e.setting}
    except OSError as e:  # the port is taken
        return 409, {"error": f"cannot listen on port {port}: {e}", "setting": "port"}
    return 200, {"url": url}


def panel_launcher() -> Callable[..., str]:
    """The panel's launch function; ImportError (no gradio) tells the user what to install."""
    try:
        import gradio  # noqa: F401  (checked here so the error names the missing package)
    except ImportError:
        raise ImportError(
            "the Ferry panel needs gradio in ComfyUI's Python: pip install 'gradio>=6,<7'"
        ) from None
    from ...web.panel.server import launch_panel

    return launch_panel
