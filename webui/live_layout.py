"""One Forge network's live Ferry layout (the UNet's, or the text encoder's): the seam's
LiveLayout (seam/live_layout.py, where ``[Note: why a "loading" mark]`` is) with what Forge's loader
does to the weights.

Forge hands the sampler a new UnetPatcher clone nearly every generation (scripts and LoRA
clone it), and every clone shares one KModel: the layout lives on it. Forge's
``memory_management.load_models_gpu`` compares patchers by identity, so before loading a new
clone ``unload_model_clones`` unpatches every old clone of the same KModel without moving it
(``forge_unpatch_model()`` with no device): the seam's loading mark keeps the layout there.
No Forge import, so CI tests it directly.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..offload_core.runtime.memory import release_freed_memory
from ..seam.live_layout import LiveLayout
from ..seam.site import DIFFUSION_MODEL, TEXT_ENCODER, NetworkSite
from .file_views import file_views, put_back
from .low_bit import bake_gguf

#: Totals for this process (the /ferry/stats route): layouts made and released (the UNet's
#: and the text encoder's), generations refused and the last refusal's message.
COUNTS: dict[str, Any] = {"layouts": 0, "releases": 0, "refusals": 0, "last_refusal": None}


class ForgeLayout(LiveLayout):
    """What Forge's loader does to a network's weights, for any network Ferry lays out in Forge:
    the UNet's (on its KModel) or the text encoders' (on the CLIP's ``JointTextEncoder``, which
    every clone of the CLIP shares); each lives on its patcher's model (``of_patcher``)."""

    attr = "_ferry_forge_layout"

    # Forge's network is plain between generations and keeps its weights' kinds: plans are
    # drawn on a meta twin, so the script's checks never touch the live layout.
    plans_on_twin = True

    def __init__(self, module: nn.Module, shared: Any = None) -> None:
        super().__init__(module, shared)
        self.layouts = 0  # how many times the groups were laid out (the /ferry/stats route)
        self._views: dict[str, torch.Tensor] = {}

    @classmethod
    def of_patcher(cls, model: Any, site: NetworkSite) -> ForgeLayout:
        """The layout of the network at ``site`` on a patcher's ``model``."""
        return cls.of(model, site.network_of(model))

    # -- the seam's hooks ------------------------------------------------------------------
    def made_plain(self) -> None:
        # Forge bakes GGUF weights on the module forge_patch_model returns, and a Ferry
        # patcher returns an empty one: bake them here (low_bit.py), before a plan or the
        # LoRA merge needs them.
        bake_gguf(self.module)

    def laying_out(self) -> None:
        self._views = file_views(self.module)  # put back on release (file_views.py)

    def laid_out(self, done: bool) -> None:
        if not done:
            self._views = {}  # apply_offload put the module back as it was
            return
        self.layouts += 1
        COUNTS["layouts"] += 1

    def released(self) -> None:
        views, self._views = self._views, {}
        if put_back(self.module, views):
            release_freed_memory()  # the copies just dropped go back to the system
        COUNTS["releases"] += 1


def layouts_of(sd_model: Any) -> list[ForgeLayout]:
    """The Ferry layouts a Forge model (``shared.sd_model``) can have: its UNet's, then its
    text encoder's; none for a part it lacks."""
    objects = getattr(sd_model, "forge_objects", None)
    unet = getattr(objects, "unet", None)
    clip = getattr(objects, "clip", None)
    out: list[ForgeLayout] = []
    for site, obj in ((DIFFUSION_MODEL, unet), (TEXT_ENCODER, clip)):
        if obj is not None:
            out.append(ForgeLayout.of_patcher(site.patcher_of(obj).model, site))
    return out
