"""One diffusion model's live Ferry offload, kept across ComfyUI's load/unload cycles.

ComfyUI clones a MODEL (a ModelPatcher) freely, and every clone shares one nn.Module. So the
offload belongs to the module, not to a patcher: the binding lives on the shared BaseModel,
and each Ferry patcher asks it to make the module match its config (``ensure``) or to let go
(``release``). Pure PyTorch + offload_core; no ComfyUI import, so CI tests it directly.

[Note: why a "loading" mark]
load_models_gpu detaches every loaded clone of a model, the model itself included, just before
it loads the requested one. Laying the groups out again on each prompt would cost a full copy
(a full rewrite on the disk tier), so a detach that is immediately followed by a Ferry patcher
with the same config keeps the offload. ComfyUI asks the *loading* patcher ``is_clone(...)``
before that detach; a Ferry patcher marks itself there (``mark_loading``). A plain patcher
leaves no mark, so a detach before it releases the offload and it gets the plain module back.

Two numbers come from the host (the patcher sets them; None outside ComfyUI): ``free_vram``,
what the host counts as free on a device, which vram_budget "auto" uses instead of
offload_core's own ``torch.cuda.mem_get_info`` (ComfyUI counts VRAM its dynamic loader could
evict as free), and ``count_pinned``, told each change of the pinned bytes Ferry holds, so the
host's pinned-memory budget counts them.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ..offload_core import (
    OffloadHandle,
    apply_offload,
    find_offload,
    plan_offload,
)
from ..offload_core.errors import WeightsLostError
from ..offload_core.model.layout import module_nbytes
from ..offload_core.model.plan import OffloadPlan
from ..offload_core.policy import AUTO, OffloadPolicy
from ..offload_core.sources.checkpoint_stream import CheckpointWeights
from .config import FerryConfig
from .recovery import ATTR, LOST, ModelReloadError, drop_and_reload, quarantine

Progress = Callable[[int, int], None]
FreeVram = Callable[[torch.device], "int | None"]
_all: weakref.WeakSet[OffloadBinding] = weakref.WeakSet()


class OffloadBinding:
    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.handle: OffloadHandle | None = None
        self.key: tuple[Any, ...] | None = None
        self.loading: FerryConfig | None = None
        self._owner: weakref.ref[Any] | None = None
        self._base: weakref.ref[Any] | None = None
        self._plans: dict[tuple[Any, str], OffloadPlan] = {}
        self.free_vram: FreeVram | None = None
        self.count_pinned: Callable[[int], None] | None = None
        self._pinned = 0  # the pinned bytes told to count_pinned
        _all.add(self)

    @staticmethod
    def of(owner: Any, module: nn.Module) -> OffloadBinding:
        """The binding stored on ``owner`` (the shared BaseModel), created on first use."""
        b = owner.__dict__.get(ATTR)
        if b is None or b.module is not module:
            b = OffloadBinding(module)
            b._base = weakref.ref(owner)
            owner.__dict__[ATTR] = b
        return b

    # -- reading ---------------------------------------------------------------------------
    @property
    def live(self) -> bool:
        return self.handle is not None and not self.handle.removed

    def plan(self, config: FerryConfig, device: torch.device | str) -> OffloadPlan:
        """The plan for ``config`` on ``device`` (validates; moves nothing; cached)."""
        k = (config.policy, str(device))
        if self.live and self.handle is not None and self.key is not None and self.key[:2] == k:
            return self.handle.plan
        if k not in self._plans:
            # Another config is laid out right now: this one replaces it when its model loads,
            # so it goes now (plans are made from the plain module), and a "model already has
            # a Ferry offload" error never reaches a node.
            self._let_go()
            policy = self._policy(config, device)
            self._plans[k] = plan_offload(self.module, policy, onload_device=device)
        return self._plans[k]

    def _policy(self, config: FerryConfig, device: torch.device | str) -> OffloadPolicy:
        """``config``'s policy with "auto" resolved by the host's count of free VRAM (the
        model's bytes are counted only then: a walk over every tensor)."""
        if config.policy.vram_budget != AUTO or self.free_vram is None:
            return config.policy
        free = self.free_vram(torch.device(device))
        if free is None:
            return config.policy
        on_device = module_nbytes(self.module, on=torch.device(device))
        return resolve_auto(config.policy, free, on_device)

    def _let_go(self) -> None:
        """Whatever Ferry layout the module has (this binding's or a lost one) is removed."""
        if find_offload(self.module) is None:
            return
        try:
            self.release()
            stray = find_offload(self.module)
            if stray is not None:
                stray.remove()
        finally:
            base = self._base() if self._base is not None else None
            if base is not None and hasattr(base, "model_loaded_weight_memory"):
                base.model_loaded_weight_memory = 0  # ComfyUI's count of the freed bytes

    def serves(self, config: FerryConfig, device: torch.device | str) -> bool:
        """True when the live layout is ``config``'s on ``device`` (whatever its weights)."""
        k = self.key
        return (
            self.live
            and k is not None
            and (k[0], k[1], k[3]) == (config.policy, str(device), config.name)
        )

    def device_bytes(self) -> int:
        """Weights Ferry holds on the onload device (outside groups, resident groups, slots)."""
        return self.handle.plan.device_bytes if self.live and self.handle is not None else 0

    # -- changing --------------------------------------------------------------------------
    def ensure(
        self,
        config: FerryConfig,
        device: torch.device | str,
        weights_version: Any,
        prepare_weights: Callable[[], CheckpointWeights | None],
        progress: Progress | None = None,
    ) -> bool:
        """Makes the module offloaded by ``config`` on ``device`` with weights at
        ``weights_version``; returns True when it had to lay the groups out (again).
        ``prepare_weights`` readies the module's weights, or returns where they wait in a
        checkpoint (a model built on meta: the groups are filled straight from the file)."""
        key = (config.policy, str(device), weights_version, config.name)
        if self.live and self.key == key:
            return False
        self.release()
        self._let_go()  # a layout another binding lost track of (see plan())
        weights = prepare_weights()
        self.handle = apply_offload(
            self.module,
            self._policy(config, device),
            onload_device=device,
            name=config.name,
            progress=progress,
            weights=weights,
        )
        self.key = key
        self._plans[key[:2]] = self.handle.plan
        self._set_pinned(self.handle.plan.bytes_per_tier()["pinned"])
        return True

    def _set_pinned(self, nbytes: int) -> None:
        if self.count_pinned is not None and nbytes != self._pinned:
            self.count_pinned(nbytes - self._pinned)
        self._pinned = nbytes

    def release(self) -> bool:
        """Removes the offload (parameters back as they were, files deleted)."""
        self.loading = None
        if not self.live:
            self.handle, self.key = None, None
            return False
        assert self.handle is not None
        try:
            self.handle.remove()  # never stops half-way
        except WeightsLostError as e:  # their only copy was a damaged file: see recovery.py
            err = drop_and_reload(None, e)
            base = self._base() if self._base is not None else None
            if base is not None:
                base.__dict__[LOST] = err  # a later Ferry load says it again (patcher.py)
            quarantine(self.module, err)  # so does a plain one (the Ferry node bypassed)
            raise err from e
        finally:
            # A RestoreIncompleteError leaves the offload live (nothing dropped): kept, so
            # the next release tries again.
            if self.handle.removed:
                self.handle, self.key, self._owner = None, None, None
                self._set_pinned(0)
        return True

    # -- the load_models_gpu handshake (see the Note above) ---------------------------------
    def mark_loading(self, config: FerryConfig | None) -> None:
        self.loading = config

    def set_owner(self, patcher: Any) -> None:
        """``patcher`` is the one loading (so using) the layout now."""
        self._owner = weakref.ref(patcher)

    def should_release_on_detach(self, patcher: Any) -> bool:
        """Whether ``detach(unpatch_all=False)`` of ``patcher`` should release the layout.

        ModelPatcher.__del__ detaches too, so a clone being garbage-collected must not pull
        the layout from under the clone that is sampling: only the owner's detach (or any
        detach once the owner is gone) releases, and not when a Ferry patcher with the same
        config is about to load (see the Note above).
        """
        if self.keep_on_detach():
            return False
        owner = self._owner() if self._owner is not None else None
        return owner is None or owner is patcher

    def keep_on_detach(self) -> bool:
        """True when the patcher about to load wants exactly the live offload."""
        keep = (
            self.live
            and self.loading is not None
            and self.key is not None
            and (self.loading.policy, self.loading.name) == (self.key[0], self.key[3])
        )
        self.loading = None
        return bool(keep)


def resolve_auto(policy: OffloadPolicy, free: int | None, on_device: int) -> OffloadPolicy:
    """``policy`` with vram_budget "auto" turned into bytes from the host's ``free`` count (the
    model's own bytes already on the device count as free: they move off), as offload_core
    does with ``torch.cuda.mem_get_info``; as it is where the host counts nothing (a CPU)."""
    if policy.vram_budget != AUTO or free is None:
        return policy
    return replace(policy, vram_budget=max(free + on_device - policy.headroom_bytes, 1))


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
            base = b._base() if b._base is not None else None
            if base is not None and hasattr(base, "model_loaded_weight_memory"):
                base.model_loaded_weight_memory = 0  # ComfyUI's count of the freed device bytes
            return f"{name}: released; the next prompt lays it out again with its node's settings"
    return f"{name}: not laid out by a Ferry node; left as it is"
