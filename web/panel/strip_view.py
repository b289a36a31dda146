"""The monitor tab's group strips: per live offload, one cell per group coloured by where it
is now (on the device, in flight, waiting, resident), from the monitor's last tick
(``group_states``: offload_core/runtime/group_states.py). The same picture as ComfyUI's
sidebar (web/comfyui/ferry_pictures.js), in the panel's words. Pure: HTML text only."""

from __future__ import annotations

import html

from ...offload_core.tools.monitor import Snapshot

#: Each letter's colour and its word in the legend, in the legend's order.
STATES = (
    ("d", "#3fae6a", "on the device"),
    ("f", "#e0b030", "in flight"),
    ("w", "#8a8a8a", "waiting"),
    ("r", "#2a6e45", "resident"),
)
_COLOUR = {letter: colour for letter, colour, _ in STATES}


def _cell(letter: str, size: str = "width:9px;height:14px") -> str:
    colour = _COLOUR.get(letter, "#555")
    return f'<span style="display:inline-block;{size};margin:1px;border-radius:2px;background:{colour}"></span>'


def strip_line(title: str, states: str) -> str:
    """One offload's strip and its legend, counting each state."""
    cells = "".join(_cell(c) for c in states)
    legend = " &nbsp; ".join(
        f"{_cell(letter, 'width:8px;height:8px')} {states.count(letter)} {word}"
        for letter, _, word in STATES
        if letter != "r" or "r" in states
    )
    return (
        f'<div class="ferry-strip-line" data-ferry-strip="{html.escape(states)}" '
        f'style="margin:4px 0 10px"><b>{html.escape(title)}</b>'
        f'<div style="display:flex;flex-wrap:wrap;margin:3px 0">{cells}</div>'
        f'<div style="font-size:12px;opacity:.85">{legend}</div></div>'
    )


def strips_html(snap: Snapshot) -> str:
    lines = [
        strip_line(o.title, str(o.stats.get("group_states") or ""))
        for o in snap.offloads
        if o.stats.get("group_states")
    ]
    if not lines:
        return '<div class="ferry-strip-none">No offloaded groups live.</div>'
    return "".join(lines)
