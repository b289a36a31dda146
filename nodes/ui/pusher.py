"""Pushes ``ferry.stats`` to every open ComfyUI page about once a second while anything is
offloaded (and once more when the last offload goes, so the sidebar shows it gone).

Nothing starts at import: the first Ferry load or the first GET /ferry/stats calls
``ensure_pushing()``, which adds a listener to the shared monitor's sampler thread.
"""

from __future__ import annotations

import threading
from typing import Any

from ...offload_core.tools.monitor import OffloadSample, Sample, get_monitor
from .stats import EVENT, observe_prompt, running_prompt_id, stats_payload

_lock = threading.Lock()
_state: dict[str, Any] = {"started": False, "had_offloads": False}


def _send(payload: dict[str, Any]) -> None:
    import server  # ComfyUI's; imported here because this module loads outside ComfyUI too

    server.PromptServer.instance.send_sync(EVENT, payload)


def on_tick(sample: Sample, offloads: list[OffloadSample], send: Any = None) -> bool:
    """Runs on the sampler thread after each tick; returns whether it pushed."""
    if not offloads and not _state["had_offloads"]:
        return False
    _state["had_offloads"] = bool(offloads)
    observe_prompt(running_prompt_id(), offloads)
    (send or _send)(stats_payload(sample, offloads, get_monitor().device))
    return True


def ensure_pushing() -> None:
    with _lock:
        if _state["started"]:
            return
        mon = get_monitor()
        mon.add_listener(on_tick)
        mon.start()
        _state["started"] = True
