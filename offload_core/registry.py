"""A process-wide list of live offloads, for the UI (read from other threads)."""

from __future__ import annotations

import threading
from typing import Protocol

from .offload_kind import OffloadKind
from .runtime.stats import OffloadStats


class LiveOffload(Protocol):
    """What the UI reads of an offload (api.py: OffloadHandle)."""

    name: str
    kind: OffloadKind

    def stats(self) -> OffloadStats: ...


_lock = threading.Lock()
_live: list[LiveOffload] = []


def register(handle: LiveOffload) -> None:
    with _lock:
        _live.append(handle)


def unregister(handle: LiveOffload) -> None:
    with _lock:
        if handle in _live:
            _live.remove(handle)


def live_offloads() -> list[LiveOffload]:
    """The offloads applied and not yet removed, oldest first (a copy of the list)."""
    with _lock:
        return list(_live)


def name_taken(name: str) -> bool:
    with _lock:
        return any(h.name == name for h in _live)
