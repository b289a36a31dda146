"""One diffusion model's live Ferry layout in ComfyUI: the seam's LiveLayout (seam/live_layout.py,
where ``[Note: why a "loading" mark]`` is) with ComfyUI's counts.

ComfyUI clones a MODEL (a ModelPatcher) freely, and every clone shares one BaseModel: the
live layout lives on it. Two numbers come from the host (the patcher sets them; None outside
ComfyUI): ``free_vram``, what the host counts as free on a device, which vram_budget "auto"
uses instead of offload_core's own ``torch.cuda.mem_get_info`` (ComfyUI counts VRAM its
dynamic loader could evict as free), and ``count_pinned``, told each change of the pinned
bytes Ferry holds, so the host's pinned-memory budget counts them. No ComfyUI import, so CI
tests it directly.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from torch import nn

from ...offload_core.errors import WeightsLostError
from ...seam.live_layout import LiveLayout, resolve_auto
from .recovery import ATTR, LOST, ModelReloadError, drop_and_reload, quarantine

__all__ = ["ATTR", "ComfyLayout", "release_from_panel", "resolve_auto"]
_all: weakref.WeakSet[ComfyLayout] = weakref.WeakSet()


class ComfyLayout(LiveLayout):
    attr = ATTR
    # ComfyUI's networks may hold lazy Linears, torchao or GGUF tensors whose meta copies
    # would not size as the real ones do: plans are drawn on the network itself.
    plans_on_twin = False

    def __init__(self, module: nn.Module, shared: Any = None) -> None:
        super().__init__(module, shared)
        self.count_pinned: Callable[[int], None] | None = None
        self._pinned = 0  # the pinned bytes told to count_pinned
        _all.add(self)

    def _set_pinned(self, nbytes: int) -> None:
        if self.count_pinned is not None and nbytes != self._pinned:
            self.count_pinned(nbytes - self._pinned)
        self._pinned = nbytes

    def _forget_device_bytes(self) -> None:
        base = self.shared()
        if base is not None and hasattr(base, "model_loaded_weight_memory"):
            base.model_loaded_weight_memory = 0  # ComfyUI's count of the freed bytes

    # -- the seam's hooks ------------------------------------------------------------------
    def laid_out(self, done: bool) -> None:
        if done and self.handle is not None:
            self._set_pinned(self.handle.plan.bytes_per_tier()["pinned"])

    def released(self) -> None:
        self._set_pinned(0)

    def let_go_of(self) -> None:
        self._forget_device_bytes()

    def weights_lost(self, err: WeightsLostError) -> BaseException:
        lost = drop_and_reload(None, err)  # see recovery.py
        base = self.shared()
        if base is not None:
            base.__dict__[LOST] = lost  # a later Ferry load says it again (patcher.py)
        quarantine(self.module, lost)  # so does a plain one (the Ferry node bypassed)
        return lost


def release_from_panel(handle: Any, policy: Any) -> str:
    """The Gradio panel's "Apply" inside ComfyUI (its ``reapply_hook``).

    The layout belongs to the Ferry node's config, so the panel does not lay it out itself
    (that would leave two offloads fighting over one module): it releases it, and the next
    prompt lays the model out again, with the saved settings where the node's
    use_panel_settings is on (the node re-runs when the settings file changes).
    """
    name = getattr(handle, "name", "model")
    for b in list(_all):
        if b.handle is handle:
            try:
                b.release()
            except ModelReloadError as e:  # a damaged file: ComfyUI reloads the model
                return str(e)
            b._forget_device_bytes()
            return f"{name}: released; the next prompt lays it out again with its node's settings"
    return f"{name}: not laid out by a Ferry node; left as it is"
