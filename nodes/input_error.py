"""A node input's error: the widget to change and what to change, in ComfyUI's words.

A ConfigError from offload_core names a *setting* ("vram_budget_gb"); a user sees *widgets*
("vram_budget"), so each error is re-raised as NodeInputError naming the widget to change.
Every room of nodes/ raises it, so it sits beside the node classes, below all of them.
"""

from __future__ import annotations

from ..offload_core import ConfigError, FerryError
from ..seam.controls import ControlNames

#: Which widget fixes each setting: the ids both hosts share (seam/controls.py) and this
#: node's own; a setting with no widget keeps its name.
NAMES = ControlNames(
    saved="use_panel_settings",
    saved_help=(
        "the Ferry panel's saved setting {setting!r} is invalid ({message}); fix it in "
        "the panel, or turn use_panel_settings off and set the widgets here"
    ),
    extra={
        "headroom_bytes": "headroom_gb",
        "headroom_gb": "headroom_gb",
        "direct_io": "direct_io",
        "verify": "verify",
        "cpu_read": "cpu_read",
        "bake_lora": "bake_lora",
        "quant_preset": "quant_preset",
    },
)


class NodeInputError(FerryError, ValueError):
    """A node input is invalid. ``input_name`` is the widget to change; str() starts with it."""

    def __init__(self, input_name: str, message: str) -> None:
        super().__init__(f"{input_name}: {message}")
        self.input_name = input_name
        self.message = message


def as_node_error(err: ConfigError, *, panel: bool = False) -> NodeInputError:
    """Re-labels an offload_core ConfigError with the widget that fixes it."""
    return NodeInputError(*NAMES.relabel(err, saved=panel))
