"""One Forge UNet's live Ferry offload, kept across the patcher clones Forge makes.

Forge hands the sampler a new UnetPatcher clone nearly every generation (scripts and LoRA
clone it), and every clone shares one KModel. So the offload belongs to the KModel, not to a
patcher: the ``UnetLayout`` lives on it, and each Ferry patcher asks it to make the network
match its offload (``ensure``) or to let go (``release``). Pure PyTorch + offload_core; no
Forge import, so CI tests it directly.

[Note: why a "loading" mark]
``memory_management.load_models_gpu`` compares patchers by identity, so a new clone is a new
model to it: before loading it, ``unload_model_clones`` asks the *loading* patcher
``is_clone(old)`` and unloads every old clone of the same KModel without moving it
(``forge_unpatch_model()`` with no device). Laying the groups out again on every generation
would cost a full copy (a full rewrite on the disk tier), so an unpatch immediately followed
by a Ferry patcher with the same offload keeps the layout. A Ferry patcher marks itself in
``is_clone``; a plain patcher (Ferry switched off) leaves no mark, so the unpatch before it
releases the layout and Forge's own load gets the plain network back.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..offload_core import OffloadHandle, apply_offload, find_offload, plan_offload
from ..offload_core.model.plan import OffloadPlan
from ..offload_core.policy import OffloadPolicy
from ..offload_core.runtime.memory import release_freed_memory
from ..web.panel.context import meta_twin
from .controls import ForgeOffload
from .file_views import file_views, put_back
from .low_bit import bake_gguf

ATTR = "_ferry_forge_layout"
#: Totals for this process (the /ferry/stats route): groups laid out, layouts released,
#: generations refused and the last refusal's message.
COUNTS: dict[str, Any] = {"layouts": 0, "releases": 0, "refusals": 0, "last_refusal": None}
Progress = Callable[[int, int], None]


class UnetLayout:
    """The Ferry offload of ``module`` (a KModel's ``diffusion_model``), if any."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.handle: OffloadHandle | None = None
        self.key: tuple[Any, ...] | None = None  # (policy, device, weights key, name)
        self.loading: ForgeOffload | None = None
        self.layouts = 0  # how many times the groups were laid out (the /ferry/stats route)
        self._owner: weakref.ref[Any] | None = None
        self._twin: nn.Module | None = None
        self._plans: dict[tuple[OffloadPolicy, str], OffloadPlan] = {}
        self._views: dict[str, torch.Tensor] = {}

    @staticmethod
    def of(kmodel: nn.Module) -> UnetLayout:
        """The layout stored on ``kmodel`` (shared by every clone), created on first use."""
        module: nn.Module = kmodel.diffusion_model  # type: ignore[assignment]
        lay = kmodel.__dict__.get(ATTR)
        if lay is None or lay.module is not module:
            lay = UnetLayout(module)
            kmodel.__dict__[ATTR] = lay
        return lay

    # -- reading ---------------------------------------------------------------------------
    @property
    def live(self) -> bool:
        return self.handle is not None and not self.handle.removed

    @property
    def weights_key(self) -> Any:
        return None if self.key is None else self.key[2]

    def plan(self, policy: OffloadPolicy, device: torch.device | str) -> OffloadPlan:
        """The plan of ``policy`` on ``device``: validates everything, moves nothing.

        Drawn on a meta copy of the network, made the first time while it is still plain,
        so a plan never touches (or needs to release) the live layout."""
        k = (policy, str(device))
        if k not in self._plans:
            if self._twin is None:
                self.release()
                stray = find_offload(self.module)
                if stray is not None:  # laid out by other code: it goes, the next load redoes it
                    stray.remove()
                bake_gguf(self.module)  # what Forge's load does to GGUF weights (low_bit.py)
                self._twin = meta_twin(self.module)
            self._plans[k] = plan_offload(self._twin, policy, onload_device=device)
        return self._plans[k]

    def serves(self, offload: ForgeOffload, device: torch.device | str, weights_key: Any) -> bool:
        return self.live and self.key == (offload.policy, str(device), weights_key, offload.name)

    def device_bytes(self) -> int:
        return self.handle.plan.device_bytes if self.live and self.handle is not None else 0

    # -- changing --------------------------------------------------------------------------
    def ensure(
        self,
        offload: ForgeOffload,
        device: torch.device | str,
        weights_key: Any,
        prepare: Callable[[], None],
        progress: Progress | None = None,
    ) -> bool:
        """Lays the network out by ``offload`` on ``device`` with weights ``weights_key``
        (the LoRA set merged into them); returns True when it had to (again). ``prepare``
        runs on the plain network first (Forge's LoRA merge)."""
        if self.serves(offload, device, weights_key):
            return False
        self.plan(offload.policy, device)  # every check, before anything moves
        self.release()
        # Forge bakes GGUF weights on the module forge_patch_model returns, and a Ferry
        # patcher returns an empty one: bake them here, before the LoRA merge needs them.
        bake_gguf(self.module)
        prepare()
        self._views = file_views(self.module)  # put back on release (file_views.py)
        try:
            self.handle = apply_offload(
                self.module, offload.policy, onload_device=device, name=offload.name,
                progress=progress,
            )  # fmt: skip
        except BaseException:
            self._views = {}  # apply_offload put the module back as it was
            raise
        self.key = (offload.policy, str(device), weights_key, offload.name)
        self.layouts += 1
        COUNTS["layouts"] += 1
        return True

    def release(self) -> bool:
        """Removes the offload: every parameter back as it was, Ferry's files deleted."""
        self.loading = None
        handle, self.handle, self.key, self._owner = self.handle, None, None, None
        if handle is None or handle.removed:
            return False
        handle.remove()  # never stops half-way
        views, self._views = self._views, {}
        if put_back(self.module, views):
            release_freed_memory()  # the copies just dropped go back to the system
        COUNTS["releases"] += 1
        return True

    # -- the load_models_gpu handshake (see the Note above) ---------------------------------
    def twin(self) -> nn.Module:
        """The network on the meta device (the panel's previews plan on it)."""
        if self._twin is None:
            self.plan(OffloadPolicy(), "cpu")
        assert self._twin is not None
        return self._twin

    def mark_loading(self, offload: ForgeOffload | None) -> None:
        self.loading = offload

    def set_owner(self, patcher: Any) -> None:
        self._owner = weakref.ref(patcher)

    def should_release_on_unpatch(self, patcher: Any) -> bool:
        """Whether ``forge_unpatch_model()`` (no device) of ``patcher`` releases the layout:
        not when a Ferry patcher with the same offload is about to load, and only from the
        patcher that loaded it (or any, once that one is gone): Forge also unpatches clones
        it finds abandoned, which must not pull the layout from under the one sampling."""
        loading, self.loading = self.loading, None
        if (
            self.live
            and loading is not None
            and self.key is not None
            and (loading.policy, loading.name) == (self.key[0], self.key[3])
        ):
            return False
        owner = self._owner() if self._owner is not None else None
        return owner is None or owner is patcher
