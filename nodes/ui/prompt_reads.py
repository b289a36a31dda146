"""What each network read from disk in the prompt running now (or the last one): its
layout's cumulative disk bytes less what they were when the prompt was first seen.

Pure: whoever sees the running prompt's id (the stats pusher's tick, the stats route, the
report node) calls ``observe`` with it and each live offload's stats; a network laid out
during the prompt counts from zero. Each layout is known by its ``layout_id`` (never reused),
not by its line's title: two networks of one class (Wan 2.2's two experts) have one title,
and a network laid out again may take back the name of one let go.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

_lock = threading.Lock()
_state: dict[str, object] = {"prompt": None, "base": {}}


def _disk(stats: Mapping[str, Any]) -> int:
    return int(stats.get("bytes_disk") or 0)


def observe(prompt_id: str | None, offloads: Iterable[Mapping[str, Any]]) -> None:
    """``offloads``: each live offload's stats now (OffloadStats.as_dict)."""
    with _lock:
        if prompt_id is not None and prompt_id != _state["prompt"]:
            base = {s.get("layout_id"): _disk(s) for s in offloads}
            _state["prompt"], _state["base"] = prompt_id, base


def read_this_prompt(stats: Mapping[str, Any]) -> int | None:
    """Bytes the layout of ``stats`` read from disk since the prompt was first seen (None:
    no prompt yet)."""
    with _lock:
        if _state["prompt"] is None:
            return None
        base: dict[Any, int] = _state["base"]  # type: ignore[assignment]
        return max(0, _disk(stats) - base.get(stats.get("layout_id"), 0))


def reset() -> None:
    with _lock:
        _state["prompt"], _state["base"] = None, {}
