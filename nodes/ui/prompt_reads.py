"""What each network read from disk in the prompt running now (or the last one): its
layout's cumulative disk bytes less what they were when the prompt was first seen.

Pure: whoever sees the running prompt's id (the stats pusher's tick, the stats route, the
report node) calls ``observe`` with it and each live offload's cumulative ``bytes_disk``;
a network laid out during the prompt counts from zero.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_state: dict[str, object] = {"prompt": None, "base": {}}


def observe(prompt_id: str | None, disk_bytes: dict[str, int]) -> None:
    """``disk_bytes``: each live offload's title -> its cumulative disk bytes now."""
    with _lock:
        if prompt_id is not None and prompt_id != _state["prompt"]:
            _state["prompt"], _state["base"] = prompt_id, dict(disk_bytes)


def read_this_prompt(title: str, disk_bytes: int) -> int | None:
    """Bytes ``title`` read from disk since the prompt was first seen (None: no prompt yet)."""
    with _lock:
        if _state["prompt"] is None:
            return None
        base: dict[str, int] = _state["base"]  # type: ignore[assignment]
        return max(0, disk_bytes - base.get(title, 0))


def reset() -> None:
    with _lock:
        _state["prompt"], _state["base"] = None, {}
