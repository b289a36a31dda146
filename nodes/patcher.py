"""A ModelPatcher that loads its diffusion model through Ferry instead of moving it whole.

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

import logging
from typing import Any

import comfy.model_patcher
import comfy.utils
import torch
from comfy.patcher_extension import CallbacksMP, WrappersMP

from ..offload_core import ApiUseError, ConfigError, Ending
from ..offload_core.model.layout import module_nbytes
from ..offload_core.sources.checkpoint_stream import CheckpointWeights
from ..seam.family import last_of_family
from ..seam.patcher_class import FerryClones, with_ferry
from . import comfy_core
from . import compile as block_compile
from .bake_lora import bake_lora
from .binding import OffloadBinding
from .config import FerryConfig, NodeInputError, as_node_error
from .dynamic import DYNAMIC_VRAM_HELP, plain_patcher, say_once
from .hold import HeldByFerry, anchor, hold
from .pusher import ensure_pushing
from .recovery import KEY as RECOVERY_KEY
from .recovery import ModelReloadError, for_node, guard, has_meta_module, in_prompt, refuse_lost
from .stream_loader import is_lazy, materialize, stream_weights, unstreamed_patches

log = logging.getLogger("ferry")


class FerryPatcherMixin(FerryClones, HeldByFerry):
    """Put in front of the input MODEL's own patcher class (see ``ferry_patcher_class``)."""

    ferry_shared = ("ferry_config",)
    ferry_config: FerryConfig | None = None
    _ferry_collected = False

    # -- helpers ---------------------------------------------------------------------------
    @staticmethod
    def _ferry_network_of(model: Any) -> Any:  # what Ferry lays out; a CLIP: text_encoder_patcher
        return getattr(model, "diffusion_model", None)

    def _ferry_binding(self) -> OffloadBinding:
        b = OffloadBinding.of(self.model, self._ferry_network_of(self.model))
        b.free_vram = comfy_core.free_vram(self)
        b.count_pinned = comfy_core.count_pinned
        return b

    def _ferry_release(self, ending: Ending = Ending.RESTORE) -> bool:
        if self._ferry_network_of(self.model) is None:
            return False
        try:
            return self._ferry_binding().release(ending)
        except ModelReloadError:
            if in_prompt():
                raise  # the node error says what happened and that the model reloads
            return True  # logged once, reload requested; ComfyUI's worker must not die

    def _ferry_laid_out(self) -> bool:
        return self._ferry_network_of(self.model) is not None and self._ferry_binding().live

    def _ferry_release_on_detach(self) -> bool:
        return self._ferry_network_of(
            self.model
        ) is not None and self._ferry_binding().should_release_on_detach(self)

    def _ferry_outside_modules(self) -> list[torch.nn.Module]:
        # BaseModel's parts other than the network (model_sampling's sigmas, ...): tiny, and
        # ComfyUI expects them on the load device.
        dm = self._ferry_network_of(self.model)
        return [m for m in self.model.children() if m is not dm]

    def _ferry_refuse_compile(self) -> None:
        # Checked on every load, before any weight moves (a laid-out model skips load()).
        refuse_lost(self.model)
        assert self.ferry_config is not None
        block_compile.check(self, self.ferry_config)

    def _ferry_prepare(self, device_to: torch.device) -> CheckpointWeights | None:
        # Start from the plain host copy: a plain clone may have left the module on the device,
        # or with lowvram weight functions that would apply its patches a second time.
        # Newer cores (>= 0.15) pin offloaded host weights in place while partially loading;
        # Ferry moves those weights into its own slabs, so they must be unregistered first.
        unpin = getattr(self, "unpin_all_weights", None)
        if callable(unpin):
            unpin()
        if getattr(self.model, "model_lowvram", False):
            for m in self.model.modules():
                comfy.model_patcher.wipe_lowvram_weight(m)
            self.model.model_lowvram = False
        weights = stream_weights(self, device_to)
        if weights is not None:
            # The Ferry loader's model: groups come straight from its file, their patches
            # computed as they are read. A text encoder's other files (a CLIP-L beside the
            # streamed T5) were read whole into the module: their patches are baked in as
            # for any model, with ComfyUI's backups (an unpatch puts the originals back).
            self._ferry_patch_weights(device_to, unstreamed_patches(self, weights))
            return weights
        self._ferry_network_of(self.model).to(self.offload_device)
        self._ferry_patch_weights(device_to, list(self.patches))
        if self.ferry_config is not None:  # GGUF's per-forward patches, computed once
            bake_lora(self, device_to, self.ferry_config.policy)
        return None

    def _ferry_materialize_plain(self) -> None:
        """A plain load of the Ferry loader's model: read it whole first, as UNETLoader does."""
        if self.ferry_config is None and is_lazy(self.model):
            materialize(self.model, self.offload_device)

    def _ferry_patch_weights(self, device_to: torch.device | None, keys: list[str]) -> None:
        """Bakes this patcher's weight patches (LoRA, ...) of ``keys`` into the host weights,
        exactly as ComfyUI's full load computes them, so Ferry lays out the patched weights."""
        for key in keys:
            bk = self.backup.get(key)
            if bk is not None:  # already patched by an earlier layout: start from the original
                comfy.utils.set_attr_param(self.model, key, bk.weight)
            self.patch_weight_to_device(key, device_to=device_to)
            w = comfy.utils.get_attr(self.model, key)
            if w.device != self.offload_device:
                comfy.utils.set_attr_param(self.model, key, w.to(self.offload_device))

    def _ferry_account(self, device: torch.device, device_bytes: int) -> None:
        """What ComfyUI's own load would record: the model is on ``device``, fully loaded,
        holding ``device_bytes`` there."""
        self.model.device = device
        self.model.model_lowvram = False
        self.model.lowvram_patch_counter = 0
        self.model.model_loaded_weight_memory = device_bytes
        if hasattr(self.model, "model_offload_buffer_memory"):
            # Newer cores count their own offload buffers here; Ferry's load uses none.
            self.model.model_offload_buffer_memory = 0
        self.model.current_weight_patches_uuid = self.patches_uuid

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
        if self._ferry_network_of(self.model) is not None:
            self._ferry_binding().mark_loading(self.ferry_config)

    def model_size(self) -> int:
        cfg = self.ferry_config
        if cfg is None:
            return super().model_size()  # type: ignore[misc]
        try:
            plan = self._ferry_binding().plan(cfg, self.load_device)
        except ConfigError:
            return super().model_size()  # type: ignore[misc]
        outside = sum(module_nbytes(m) for m in self._ferry_outside_modules())
        return plan.device_bytes + outside

    def partially_load(
        self, device_to: Any, extra_memory: Any = 0, *args: Any, **kwargs: Any
    ) -> Any:
        cfg = self.ferry_config
        self._ferry_materialize_plain()
        if cfg is not None:
            self._ferry_refuse_compile()
            self._ferry_binding().set_owner(self)
        if cfg is not None and not self._ferry_binding().serves(cfg, device_to):
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
        cfg = self.ferry_config
        self._ferry_materialize_plain()
        if cfg is None:
            return super().load(
                device_to, lowvram_model_memory, force_patch_weights, full_load, **kwargs
            )  # type: ignore[misc]
        device = device_to if device_to is not None else self.load_device
        self._ferry_refuse_compile()
        with self.use_ejected():
            self.unpatch_hooks()
            binding = self._ferry_binding()
            pbar = comfy.utils.ProgressBar(1)

            def progress(done: int, total: int) -> None:
                pbar.update_absolute(done, total)

            try:
                changed = binding.ensure(
                    cfg,
                    device,
                    self.patches_uuid if self.patches else None,
                    lambda: self._ferry_prepare(device),
                    progress,
                )
            except ConfigError as e:
                raise as_node_error(e) from None
            except ApiUseError as e:  # unreachable by design (seam/layout.py); in ComfyUI's words
                raise for_node(e) from None
            outside = 0
            for m in self._ferry_outside_modules():
                m.to(device)
                outside += module_nbytes(m)
            if changed:
                log.info("ferry: laid out %s\n%s", cfg.title, binding.handle.plan.describe())
                comfy_core.say_if_ram_cache_drops_models()
            self._ferry_account(device, binding.device_bytes() + outside)
            for callback in self.get_all_callbacks(CallbacksMP.ON_LOAD):
                callback(self, device_to, lowvram_model_memory, force_patch_weights, full_load)
            self.apply_hooks(self.forced_hooks, force_apply=True)
        ensure_pushing()

    def partially_unload(
        self, device_to: Any, memory_to_free: int = 0, *args: Any, **kwargs: Any
    ) -> int:
        if self.ferry_config is None and not self._ferry_laid_out():
            return super().partially_unload(device_to, memory_to_free, *args, **kwargs)  # type: ignore[misc]
        # Freeing part of a layout would mean moving groups behind the engine's back. Reporting
        # nothing freed makes ComfyUI unload the whole model instead (detach -> release).
        return 0

    def unpatch_model(self, device_to: Any = None, unpatch_weights: bool = True) -> None:
        # Before ComfyUI restores the unpatched weights and moves the model, the module must
        # be plain again.
        if unpatch_weights and self._ferry_release():
            self.model.model_loaded_weight_memory = 0
        net = self._ferry_network_of(self.model)
        if device_to is not None and unpatch_weights and net is not None and has_meta_module(net):
            # The weights are back in their file (meta): move only what is real.
            for m in self._ferry_outside_modules():
                m.to(device_to)
            super().unpatch_model(None, unpatch_weights)  # type: ignore[misc]
            self.model.device = device_to
            return None
        return super().unpatch_model(device_to, unpatch_weights)  # type: ignore[misc]

    def detach(self, unpatch_all: bool = True) -> Any:
        # See seam/layout.py: a full unload releases; a detach releases only when no Ferry reload
        # with the same config follows and this patcher owns the layout (or nobody does). A
        # Ferry patcher being garbage-collected (its cached node output dropped because the
        # node ran again) leaves that to its Ferry parent: see hold.py's [Note: the anchor].
        if not unpatch_all and self._ferry_collected and isinstance(self.parent, HeldByFerry):
            return super().detach(unpatch_all)  # type: ignore[misc]
        release = unpatch_all or self._ferry_release_on_detach()
        if release and self._ferry_release(self._ferry_ending(unpatch_all)):
            self.model.model_loaded_weight_memory = 0
        return super().detach(unpatch_all)  # type: ignore[misc]

    def _ferry_ending(self, unpatch_all: bool) -> Ending:
        """DISCARD where this patcher is being collected and was the last of its family, so
        nothing can load the network again ([Note: the last of a family], seam/family.py):
        Ferry's copies are dropped unread. Any other release gives the weights back (an
        unload keeps the model in ComfyUI's cache; a plain clone may load it next)."""
        if self._ferry_collected and not unpatch_all and last_of_family(self):
            return Ending.DISCARD
        return Ending.RESTORE

    def __del__(self) -> None:
        self._ferry_collected = True
        super_del = getattr(super(), "__del__", None)
        if super_del is not None:
            super_del()


def ferry_patcher_class(base: type) -> type:
    """``base`` with Ferry's loading in front; keeps another pack's subclass (e.g. GGUF's)."""
    return with_ferry(FerryPatcherMixin, base)


def ferry_clone(
    model: Any, config: FerryConfig, mixin: type[FerryPatcherMixin] = FerryPatcherMixin
) -> Any | None:
    """A clone of the MODEL ``model`` (or CLIP patcher, with ``mixin``) whose loads go through
    Ferry; None where it must stay ComfyUI's (dynamic VRAM, no plain copy: said once, flagged)."""
    if mixin._ferry_network_of(getattr(model, "model", None)) is None:
        raise NodeInputError("model", "is not a diffusion model (it has no diffusion_model)")
    src, why = plain_patcher(model)  # ComfyUI >= 0.15 with dynamic VRAM: see dynamic.py
    if src is None:
        say_once("dynamic-vram", DYNAMIC_VRAM_HELP.format(why=why or ""))
        return None
    n = src.clone()
    n.__class__ = with_ferry(mixin, type(src))
    n.ferry_config = config
    n.parent = anchor(model, src, with_ferry(mixin, type(src)))
    if guard not in n.get_wrappers(WrappersMP.APPLY_MODEL, RECOVERY_KEY):
        n.add_wrapper_with_key(WrappersMP.APPLY_MODEL, RECOVERY_KEY, guard)
    block_compile.adopt(n)  # TorchCompileModel before Ferry
    hold(n)
    return n
