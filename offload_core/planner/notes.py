"""The planner's sentence for each network a host planned, by its line's title ("text
encoder: t5xxl"), for every UI's line of it: ComfyUI's sidebar and memory report, the
panel's monitor. A host writes it when it resolves "auto" settings (nodes/planning/auto_settings.py);
the lines read it."""

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
