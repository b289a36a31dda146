"""Starts and stops the panel's web server; the same code standalone and inside ComfyUI.

``launch_panel`` is safe to call twice (a ComfyUI sidebar button pressed twice): the second
call returns the running panel's URL. gradio is imported here, inside the call, never at
import time.
"""

from __future__ import annotations

import ipaddress
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...offload_core.errors import ConfigError
from ...offload_core.tools.monitor import get_monitor
from ...offload_core.tools.settings_file import PanelSettings
from .compat import launch_options
from .context import DemoSession, PanelContext

_lock = threading.Lock()
_running: dict[str, Any] = {}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def launch_panel(
    host: str = "127.0.0.1",
    port: int | None = None,
    *,
    allow_remote: bool = False,
    demo_size_gb: float | None = None,
    settings_path: str | Path | None = None,
    is_busy: Callable[[], bool] | None = None,
    reapply_hook: Callable[[Any, Any], str] | None = None,
) -> str:
    """Starts the panel in this process (in the background) and returns its URL.

    host: 127.0.0.1 by default. Any other address lets other machines on the network change
    your settings, so it needs ``allow_remote=True`` and prints a warning.
    demo_size_gb: build, offload and offer to run the built-in demo model (standalone use).
    is_busy: the host's "a job is running" test; Apply refuses while it is True.
    reapply_hook: ``hook(handle, policy) -> status line``, for a host that must re-offload its
    models itself (ComfyUI's live layout keeps each handle); default: remove() then apply_offload.
    """
    with _lock:
        # Checked even when a panel already runs: a refused address is refused every time.
        _check_host(host, allow_remote)
        if _running:
            return str(_running["url"])
        if not is_loopback(host):
            print(f"ferry panel: WARNING: listening on {host}: anyone who can reach this machine "
                  "can change Ferry's settings and run the planner", file=sys.stderr)  # fmt: skip
        _check_port_and_demo(port, demo_size_gb)
        # No phoning home from a tool that may run beside private work.
        os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
        monitor = get_monitor()
        started_monitor = not monitor.running
        monitor.start()
        ctx = PanelContext(
            settings_path=settings_path, monitor=monitor, is_busy=is_busy, reapply_hook=reapply_hook
        )
        try:
            blocks, url = _start(ctx, host, port, demo_size_gb)
        except BaseException:
            # A busy port (OSError) or a failed build leaves nothing running behind.
            _release(ctx, started_monitor)
            raise
        _running.update(url=url, blocks=blocks, ctx=ctx, started_monitor=started_monitor)
        return str(url)


def _check_host(host: Any, allow_remote: bool) -> None:
    if not isinstance(host, str) or not host.strip():
        raise ConfigError("host", f"must be an address such as 127.0.0.1, got {host!r}")
    if not is_loopback(host) and not allow_remote:
        raise ConfigError(
            "host",
            f"{host} would let other machines reach the panel; pass allow_remote=True "
            "(tools/panel.py: --listen) to mean it, or use 127.0.0.1",
        )


def _check_port_and_demo(port: Any, demo_size_gb: Any) -> None:
    if port is not None and (
        isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536
    ):
        raise ConfigError("port", f"must be 1..65535 or empty for the first free one, got {port!r}")
    if demo_size_gb is not None and not demo_size_gb > 0:
        raise ConfigError("demo_size_gb", f"must be > 0, got {demo_size_gb!r}")


def _start(
    ctx: PanelContext, host: str, port: int | None, demo_size_gb: float | None
) -> tuple[Any, str]:
    """Builds the demo (standalone use) and the page, and starts serving it."""
    from .app import build_panel

    if demo_size_gb is not None:
        ctx.demo = DemoSession(size_gb=float(demo_size_gb))
        try:
            saved = ctx.load()
        except ConfigError as e:
            saved = PanelSettings()
            print(f"ferry panel: settings file ignored: {e}", file=sys.stderr)
        ctx.last_status = ctx.start_demo(saved)
    blocks = build_panel(ctx)
    blocks.queue()
    _, url, _ = blocks.launch(
        server_name=host, server_port=port, prevent_thread_lock=True, quiet=True,
        inbrowser=False, share=False, show_error=True, **launch_options(),
    )  # fmt: skip
    return blocks, str(url)


def panel_url() -> str | None:
    with _lock:
        return _running.get("url")


def panel_context() -> PanelContext | None:
    with _lock:
        return _running.get("ctx")


def close_panel() -> None:
    """Stops the server; removes the demo model's offload (deleting only Ferry's own files)."""
    with _lock:
        if not _running:
            return
        _running["blocks"].close()
        _release(_running["ctx"], _running["started_monitor"])
        _running.clear()


def _release(ctx: PanelContext, stop_monitor: bool) -> None:
    if ctx.demo is not None and ctx.demo.model is not None:
        from ...offload_core import find_offload

        handle = find_offload(ctx.demo.model)
        if handle is not None:
            handle.remove()  # deletes only the files this offload wrote
    if stop_monitor:
        ctx.monitor.stop()
