"""The planner's sentence for each network a Ferry node laid out, by its line's title
("text encoder: t5xxl"), for the sidebar's line and the report node. Pure: stats.py (pure
too) reads it; the offload nodes write it when they resolve their "auto" settings."""

from __future__ import annotations

import threading

_lock = threading.Lock()
_why: dict[str, str] = {}


def remember(title: str, sentence: str) -> None:
    with _lock:
        _why[title] = sentence


def why(title: str) -> str | None:
    with _lock:
        return _why.get(title)
