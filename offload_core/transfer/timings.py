"""Intervals the device times (a copy, a stall), added to the counters once they finished: a
pair of timing events per interval, recorded on the stream that did the work and read later
without waiting (``resolve``), or after one host wait when the engine is quiesced (``flush``).
"""

from __future__ import annotations

import threading
from typing import Any, Protocol


class Adds(Protocol):
    def add(self, **kw: float) -> None: ...


class DeviceTimings:
    def __init__(self, counters: Adds) -> None:
        self.counters = counters
        self._pending: list[tuple[str, Any, Any]] = []  # (what, start event, end event)
        self._lock = threading.Lock()

    def timed(self, kind: str, pair: tuple[Any, Any]) -> None:
        """``kind`` ("stall" or "h2d") lasted from ``pair[0]`` to ``pair[1]`` on the device."""
        with self._lock:
            self._pending.append((kind, pair[0], pair[1]))

    def resolve(self) -> None:
        """Adds the device-timed intervals that have finished to the counters."""
        with self._lock:
            pending, self._pending = self._pending, []
        keep = []
        for kind, start, end in pending:
            if not end.query():
                keep.append((kind, start, end))
                continue
            seconds = start.elapsed_time(end) / 1000.0
            self.counters.add(**({"stall_s": seconds} if kind == "stall" else {"h2d_s": seconds}))
        with self._lock:
            self._pending = keep + self._pending

    def flush(self, host_wait_for_compute: Any) -> None:
        """Every interval, after ``host_wait_for_compute()`` (the engine is quiet)."""
        if self._pending:
            host_wait_for_compute()
            self.resolve()
