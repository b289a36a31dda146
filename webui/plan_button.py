"""The accordion's Plan button, wired to its controls and to Forge's Steps and CFG Scale
sliders: the planner weighs a network by how often a generation reads it (webui/auto_plan.py:
``unet_reads``), so the Plan reads the sliders the generation will use.

The sliders are not the script's: the script asks Forge for them by elem_id
(``Script.on_after_component``, registered in ``show()``, before Forge builds its UI). In
Forge's layout they are built before the scripts' accordions; where a reordered UI builds
them after, the click is wired when the last of them appears. A host without the hook (the
stand-ins of CI) wires the click at once, and the Plan counts Forge's default steps and CFG.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: The sliders the Plan reads, by their elem_id's tail (``txt2img_steps``, ``img2img_cfg_scale``).
SLIDERS = ("steps", "cfg_scale")


class PlanButton:
    """One tab's Plan button click: wired once the accordion's controls (``wire``) and, where
    the host reports them (``watch``), both sliders exist."""

    def __init__(self) -> None:
        self.sliders: dict[str, Any] = {}
        self.watched = False
        self._pending: Callable[[list[Any]], None] | None = None

    def watch(self, script: Any, tab: str) -> None:
        """Asks the host, through ``script`` (a ``scripts.Script``), for the tab's sliders."""
        hook = getattr(script, "on_after_component", None)
        if hook is None:
            return
        self.watched = True
        for key in SLIDERS:
            hook(lambda on, key=key: self._seen(key, on.component), elem_id=f"{tab}_{key}")

    def wire(self, connect: Callable[[list[Any]], None]) -> None:
        """``connect(sliders)`` makes the click with the sliders as its last inputs (none where
        the host does not report them)."""
        self._pending = connect
        self._connect()

    def _seen(self, key: str, component: Any) -> None:
        self.sliders[key] = component
        self._connect()

    def _connect(self) -> None:
        if self._pending is None:
            return
        if not self.watched:
            connect, self._pending = self._pending, None
            connect([])
        elif all(k in self.sliders for k in SLIDERS):
            connect, self._pending = self._pending, None
            connect([self.sliders[k] for k in SLIDERS])
