"""An offload_core error in the words of the control that fixes it, for any host.

A ConfigError names a *setting* ("vram_budget_gb"); a user sees *controls*: ComfyUI's widgets,
Forge's accordion. Both hosts name the controls they share the same way (``SHARED_CONTROLS``);
each says which control switches its saved settings on and what its own extra controls are,
and wraps the (control, message) pair in its own error class (``NodeInputError``,
``ControlError``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..offload_core import ConfigError

#: offload_core setting -> the control a user changes to fix it, on every host.
SHARED_CONTROLS: Mapping[str, str] = {
    "level": "level",
    "blocks_per_group": "blocks_per_group",
    "tier": "tier",
    "disk_path": "disk_path",
    "source_checkpoint": "disk_path",
    "prefetch_depth": "prefetch_depth",
    "vram_budget": "vram_budget",
    "vram_budget_gb": "vram_budget",
}


@dataclass(frozen=True)
class ControlNames:
    """How one host names the controls behind offload_core's settings.

    ``saved``: the control that makes the host read the saved settings file; ``saved_help``:
    what to say when a saved value is bad (formatted with ``setting`` and ``message``);
    ``extra``: the host's controls for settings beyond ``SHARED_CONTROLS``; ``unshown``: the
    control to name for a setting the host shows no control for (None: the setting's own
    name, with the message as it is).
    """

    saved: str
    saved_help: str
    extra: Mapping[str, str] = field(default_factory=dict)
    unshown: str | None = None

    def relabel(self, err: ConfigError, *, saved: bool = False) -> tuple[str, str]:
        """(the control that fixes ``err``, the message in its words)."""
        message = str(err).removeprefix(f"{err.setting}: ")
        if saved:  # the values came from the settings file, not from a control
            return self.saved, self.saved_help.format(setting=err.setting, message=message)
        control = self.extra.get(err.setting) or SHARED_CONTROLS.get(err.setting)
        if control is not None:
            return control, message
        if self.unshown is None:
            return err.setting, message
        return self.unshown, str(err)
