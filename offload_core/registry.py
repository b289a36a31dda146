"""A process-wide list of live offloads, for the UI (read from other threads)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .api import OffloadHandle

_lock = threading.Lock()
_live: list[OffloadHandle] = []


def register(handle: OffloadHandle) -> None:
    with _lock:
        _live.append(handle)


def unregister(handle: OffloadHandle) -> None:
    with _lock:
        if handle in _live:
            _live.remove(handle)


def live_offloads() -> list[OffloadHandle]:
    """The offloads applied and not yet removed, oldest first (a copy of the list)."""
    with _lock:
        return list(_live)


def name_taken(name: str) -> bool:
    with _lock:
        return any(h.name == name for h in _live)
