"""A host the tests add the way any new host is added (seam/): one adapter file, this one,
and one registration (``ferry_patcher_class``: the host's patcher class with Ferry's verbs in
front, as ComfyUI's ``nodes/patcher/patcher.py`` and Forge's ``webui/patcher.py`` make theirs).

The host (tests/test_seam_host.py ``TinyHost``) is the smallest one with the shape of
ComfyUI's and Forge's: a shared model object whose ``diffusion_model`` every patcher clone
shares; a loader that, before loading a patcher, asks it ``is_clone(old)`` and unloads each old
clone of the same model without moving it (``unload(None)``), or moves it off
(``unload(device)``) to free memory. The adapter overrides those verbs; everything about the
layout (when to keep it, when to lay it out again, plans, the owner) is the seam's.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from tests.conftest import PACK_NAME, load_pack

load_pack()
seam_layout = importlib.import_module(f"{PACK_NAME}.seam.live_layout")
seam_class = importlib.import_module(f"{PACK_NAME}.seam.patcher_class")
seam_offload = importlib.import_module(f"{PACK_NAME}.seam.offload")


class TinyHostLayout(seam_layout.LiveLayout):  # type: ignore[name-defined,misc]
    """The live layout on the host's shared model object; records the seam's hooks."""

    attr = "_ferry_tiny_host_layout"
    plans_on_twin = True  # the host's weights are plain tensors: a meta twin sizes them

    def __init__(self, module: torch.nn.Module, shared: Any = None) -> None:
        super().__init__(module, shared)
        self.events: list[str] = []

    def laid_out(self, done: bool) -> None:
        self.events.append("laid out" if done else "failed")

    def released(self) -> None:
        self.events.append("released")


class FerryVerbs(seam_class.FerryClones):  # type: ignore[name-defined,misc]
    """Put in front of the host's patcher class: its loading verbs go through the seam."""

    ferry_shared = ("ferry_offload",)
    ferry_offload: Any = None
    model: Any
    device: torch.device

    def ferry_layout(self) -> Any:
        return TinyHostLayout.of(self.model)

    def _ferry_mark_loading(self) -> None:
        # [Note: why a "loading" mark] (seam/handshake.py)
        self.ferry_layout().handshake.mark_loading(self.ferry_offload)

    def load(self) -> None:
        layout = self.ferry_layout()
        layout.handshake.set_owner(self)
        layout.ensure(self.ferry_offload, self.device, None, lambda: None)

    def unload(self, device: torch.device | None) -> None:
        layout = self.ferry_layout()
        if device is not None or layout.handshake.should_release_on_detach(self):
            layout.release()
        if not layout.live:
            super().unload(device)  # type: ignore[misc]


def ferry_patcher_class(base: type) -> type:
    """The registration: ``base`` (the host's patcher class) with Ferry's verbs in front."""
    return seam_class.with_ferry(FerryVerbs, base)  # type: ignore[no-any-return]


def ferry_clone(patcher: Any, policy: Any, name: str = "net") -> Any:
    """A clone of the host's ``patcher`` whose loads lay its network out by ``policy``."""
    n = patcher.clone()
    n.__class__ = ferry_patcher_class(type(patcher))
    n.ferry_offload = seam_offload.HeldOffload(policy, name)
    return n
