"""A ModelPatcher that loads its network through Ferry instead of moving it whole: a MODEL's
diffusion model, a CLIP's text encoder, a ControlNet, a model patch or a CLIP vision model
(each a site: seam/site.py says where the network is on the patcher's model).

Integrates the way ComfyUI core expects (as ComfyUI-GGUF does): a ModelPatcher subclass that
overrides the loading verbs, no global monkeypatching. What ComfyUI sees:

- ``load``: Ferry lays the groups out (or keeps the live layout) and reports the bytes it holds
  on the device as ``model_loaded_weight_memory``, so ComfyUI's accounting sees them;
  ``model_size`` is Ferry's device footprint, so ComfyUI frees that much room, not the model's.
- ``partially_unload`` frees nothing piecemeal (ComfyUI would move Ferry's groups behind its
  back); ComfyUI then unloads the model entirely, which releases Ferry's device memory.
- LoRA and other weight patches are computed the way ComfyUI computes them (on the load device,
  in the dtype that core computes them in, with its rounding) and only then laid out, so a LoRA
  after Ferry gives the same output as without Ferry. A patch change lays the groups out again.
- ``clone()`` keeps the class and the config, so every node after Ferry keeps the offload, also
  where a pack's clone sets its own class back (ComfyUI-GGUF's does: seam/patcher_class.py). A
  clone that loses Ferry anyway (a node that builds its patcher some other way) is said once
  in the log, naming the node, when it samples (hold.py: ``[Note: a hold that says when
  it is lost]``).
- Under dynamic VRAM (ComfyUI >= 0.15 on NVIDIA) Ferry drives the model's non-dynamic delegate
  (dynamic.py); vram_budget "auto" counts free what ComfyUI counts free, and Ferry's pinned
  slabs count in ComfyUI's pinned-memory budget (comfy_core.py).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from comfy.patcher_extension import CallbacksMP, WrappersMP

from ...offload_core import ConfigError, Ending
from ...offload_core.model.layout import module_nbytes
from ...seam.patcher_class import FerryClones, with_ferry
from ...seam.site import DIFFUSION_MODEL, NetworkSite
from ..input_error import NodeInputError
from ..planning.config import ComfyOffload
from ..ui.pusher import ensure_pushing
from . import block_compile, comfy_core
from . import load_steps as steps
from .dynamic import DYNAMIC_VRAM_HELP, plain_patcher, say_once
from .hold import HeldByFerry, anchor, hold
from .live_layout import ComfyLayout
from .recovery import KEY as RECOVERY_KEY
from .recovery import ModelReloadError, guard, has_meta_module, in_prompt


class FerryPatcherMixin(FerryClones, HeldByFerry):
    """Put in front of the patcher class of any network Ferry offloads (``ferry_clone``);
    ``ferry_site`` says where on the patcher's model the network is (seam/site.py)."""

    ferry_shared = ("ferry_offload", "ferry_site")
    ferry_offload: ComfyOffload | None = None
    ferry_site: NetworkSite = DIFFUSION_MODEL
    _ferry_collected = False

    # -- helpers (the load's steps are in load_steps.py) -----------------------------------
    def _ferry_network(self) -> torch.nn.Module | None:
        return self.ferry_site.network_of(self.model)

    def _ferry_layout(self) -> ComfyLayout:
        b = ComfyLayout.of(self.model, self._ferry_network())
        b.free_vram = comfy_core.free_vram(self)
        b.count_pinned = comfy_core.count_pinned
        return b

    def _ferry_release(self, ending: Ending = Ending.RESTORE) -> bool:
        if self._ferry_network() is None:
            return False
        try:
            return self._ferry_layout().release(ending)
        except ModelReloadError:
            if in_prompt():
                raise  # the node error says what happened and that the model reloads
            return True  # logged once, reload requested; ComfyUI's worker must not die

    def _ferry_release_on_detach(self) -> bool:
        if self._ferry_network() is None:
            return False
        return self._ferry_layout().handshake.should_release_on_detach(self)

    # -- ModelPatcher verbs ----------------------------------------------------------------
    def clone(self, *args: Any, **kwargs: Any) -> Any:
        n = super().clone(*args, **kwargs)
        # Newer cores give a clone ``self.model_size()`` as its size, which for a Ferry patcher
        # is Ferry's device footprint, not the model's: keep the model's.
        if hasattr(self, "size"):
            n.size = self.size
        return n

    def add_wrapper_with_key(self, wrapper_type: str, key: str, wrapper: Any) -> None:
        # TorchCompileModel after Ferry: its whole-model compile becomes the blocks' (compile.py).
        wrapper = block_compile.in_place_of(self, wrapper_type, key, wrapper)
        super().add_wrapper_with_key(wrapper_type, key, wrapper)  # type: ignore[misc]

    def _ferry_mark_loading(self) -> None:
        if self._ferry_network() is not None:
            self._ferry_layout().handshake.mark_loading(self.ferry_offload)

    def model_size(self) -> int:
        cfg = self.ferry_offload
        if cfg is None:
            return super().model_size()  # type: ignore[misc]
        try:
            plan = self._ferry_layout().plan(cfg, self.load_device)
        except ConfigError:
            return super().model_size()  # type: ignore[misc]
        outside = sum(module_nbytes(m) for m in self.ferry_site.outside(self.model))
        return plan.device_bytes + outside

    def partially_load(
        self, device_to: Any, extra_memory: Any = 0, *args: Any, **kwargs: Any
    ) -> Any:
        cfg = self.ferry_offload
        steps.materialize_plain(self)
        if cfg is not None:
            steps.refuse_compile(self)
            self._ferry_layout().handshake.set_owner(self)
        if cfg is not None and not self._ferry_layout().serves(cfg, device_to):
            # Whatever holds the module now (a plain clone's full load) is not Ferry's layout:
            # report nothing loaded, so ModelPatcher.partially_load goes on to our load().
            self.model.model_loaded_weight_memory = 0
        return super().partially_load(device_to, extra_memory, *args, **kwargs)  # type: ignore[misc]

    def load(
        self,
        device_to: Any = None,
        lowvram_model_memory: int = 0,
        force_patch_weights: bool = False,
        full_load: bool = False,
        **kwargs: Any,
    ) -> None:
        steps.materialize_plain(self)
        if self.ferry_offload is None:
            return super().load(
                device_to, lowvram_model_memory, force_patch_weights, full_load, **kwargs
            )  # type: ignore[misc]
        device = device_to if device_to is not None else self.load_device
        steps.refuse_compile(self)
        with self.use_ejected():
            self.unpatch_hooks()
            steps.account(self, device, steps.lay_out(self, device))
            for callback in self.get_all_callbacks(CallbacksMP.ON_LOAD):
                callback(self, device_to, lowvram_model_memory, force_patch_weights, full_load)
            self.apply_hooks(self.forced_hooks, force_apply=True)
        ensure_pushing()

    def partially_unload(
        self, device_to: Any, memory_to_free: int = 0, *args: Any, **kwargs: Any
    ) -> int:
        laid_out = self._ferry_network() is not None and self._ferry_layout().live
        if self.ferry_offload is None and not laid_out:
            return super().partially_unload(device_to, memory_to_free, *args, **kwargs)  # type: ignore[misc]
        # Freeing part of a layout would mean moving groups behind the engine's back. Reporting
        # nothing freed makes ComfyUI unload the whole model instead (detach -> release).
        return 0

    def unpatch_model(self, device_to: Any = None, unpatch_weights: bool = True) -> None:
        # Before ComfyUI restores the unpatched weights and moves the model, the module must
        # be plain again.
        if unpatch_weights and self._ferry_release():
            self.model.model_loaded_weight_memory = 0
        net = self._ferry_network()
        if device_to is not None and unpatch_weights and net is not None and has_meta_module(net):
            # The weights are back in their file (meta): move only what is real.
            for m in self.ferry_site.outside(self.model):
                m.to(device_to)
            super().unpatch_model(None, unpatch_weights)  # type: ignore[misc]
            self.model.device = device_to
            return None
        return super().unpatch_model(device_to, unpatch_weights)  # type: ignore[misc]

    def detach(self, unpatch_all: bool = True) -> Any:
        # See seam/live_layout.py: a full unload releases; a detach releases only when no Ferry reload
        # with the same config follows and this patcher owns the layout (or nobody does). A
        # Ferry patcher being garbage-collected (its cached node output dropped because the
        # node ran again) leaves that to its Ferry parent: see hold.py's [Note: the anchor].
        if not unpatch_all and self._ferry_collected and isinstance(self.parent, HeldByFerry):
            return super().detach(unpatch_all)  # type: ignore[misc]
        release = unpatch_all or self._ferry_release_on_detach()
        if release and self._ferry_release(steps.ending(self, unpatch_all)):
            self.model.model_loaded_weight_memory = 0
        return super().detach(unpatch_all)  # type: ignore[misc]

    def __del__(self) -> None:
        self._ferry_collected = True
        super_del = getattr(super(), "__del__", None)
        if super_del is not None:
            super_del()


def ferry_patcher_class(base: type) -> type:
    """``base`` with Ferry's loading in front; keeps another pack's subclass (e.g. GGUF's)."""
    return with_ferry(FerryPatcherMixin, base)


def ferry_patcher(patcher: Any, site: NetworkSite = DIFFUSION_MODEL) -> Any:
    """``patcher`` itself, its class with Ferry's in front, holding no offload (a plain load
    reads the weights whole): the Ferry loaders' patchers, ready for an offload node."""
    patcher.__class__ = ferry_patcher_class(type(patcher))
    patcher.ferry_site = site
    return patcher


def ferry_clone(obj: Any, config: ComfyOffload, site: NetworkSite = DIFFUSION_MODEL) -> Any | None:
    """A copy of the host's object ``obj`` (a MODEL, CLIP, CONTROL_NET, ...: ``site`` says
    where its patcher and network are) whose patcher loads through Ferry; None where it must
    stay ComfyUI's (dynamic VRAM, no plain copy: said once, flagged)."""
    held = site.patcher_of(obj) if obj is not None else None
    if held is None or site.network_of(getattr(held, "model", None)) is None:
        raise NodeInputError(site.control, f"holds no {site.what} Ferry can offload")
    src, why = plain_patcher(held)  # ComfyUI >= 0.15 with dynamic VRAM: see dynamic.py
    if src is None:
        say_once("dynamic-vram", DYNAMIC_VRAM_HELP.format(why=why or ""))
        return None
    n = src.clone()
    cls = ferry_patcher_class(type(src))
    n.__class__ = cls
    n.ferry_offload, n.ferry_site = config, site
    n.parent = anchor(held, src, cls, site)
    if guard not in n.get_wrappers(WrappersMP.APPLY_MODEL, RECOVERY_KEY):
        n.add_wrapper_with_key(WrappersMP.APPLY_MODEL, RECOVERY_KEY, guard)
    block_compile.adopt(n)  # TorchCompileModel before Ferry
    hold(n)
    return holder_with(obj, n, site)


def holder_with(obj: Any, patcher: Any, site: NetworkSite) -> Any:
    """A copy of ``obj`` (its host's own copy verb) holding ``patcher`` where ``site`` says,
    and the network beside it pointed at the patcher's (a delegate's under dynamic VRAM)."""
    if not site.patcher:
        return patcher
    out = getattr(obj, site.copy)() if site.copy else copy.copy(obj)
    setattr(out, site.patcher, patcher)
    if site.mirror:
        setattr(out, site.mirror, patcher.model)
    return out
