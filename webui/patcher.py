"""A Forge UnetPatcher that loads its UNet through Ferry instead of moving it whole.

Integrates the way Forge's own patchers do: a subclass of the UNet's patcher class whose
loading verbs Forge's memory manager calls (``backend/memory_management.py``), no global
monkeypatching. What Forge sees:

- ``forge_patch_model`` (from ``LoadedModel.model_load``): Ferry lays the groups out on the
  load device (or keeps the live layout), after merging the patcher's LoRA set into the
  plain weights exactly as Forge's ``LoraLoader`` does, so a LoRA gives Forge's weights. It
  returns an empty module as the part Forge may place itself: where Forge would fall back to
  its own CPU swap (``build_module_profile``), it finds nothing to move behind Ferry's back.
- ``forge_unpatch_model(device)`` (a full unload: ``free_memory``, a checkpoint switch)
  releases the layout; ``forge_unpatch_model()`` (a clone replacing this one) keeps it when
  the next patcher is Ferry's with the same offload (seam/layout.py's Note).
- ``refresh_loras`` never merges into a live layout.
- No ``model_size``: Forge calls it only from ``ModelPatcher.__init__`` (a Ferry patcher is
  still Forge's class then: ``ferry_clone`` switches it after), and reads the ``size`` it
  keeps only to hand it to a clone. ``load_models_gpu`` sizes a model by where its
  parameters are (``module_size``): no override changes what it frees for a Ferry UNet.
- ``clone()`` keeps the class and the offload, so scripts that clone the UNet after Ferry's
  (FreeU, ...) keep the offload.
- A refused setting (``ferry_refusal``) is raised from ``forge_patch_model``, before any
  weight moves: Forge reports errors from a script's hooks and goes on, but an error from a
  model load stops the generation and reaches the UI and the API with its message.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from ..offload_core import ConfigError, Ending, FerryError
from ..seam.patcher_class import FerryClones, with_ferry
from .controls import ControlError, ForgeOffload, as_control_error
from .layout import UnetLayout
from .loaded import checkpoint_holds

log = logging.getLogger("ferry")


class FerryPatcherMixin(FerryClones):
    """Put in front of the UNet's own patcher class (see ``ferry_patcher_class``)."""

    ferry_shared = ("ferry_offload", "ferry_refusal")
    ferry_offload: ForgeOffload | None = None
    ferry_refusal: FerryError | None = None
    # Forge's ModelPatcher sets these (declared for the type checker only).
    model: Any
    lora_patches: dict[Any, Any]
    load_device: Any
    current_device: Any

    # -- helpers ---------------------------------------------------------------------------
    def _ferry_layout(self) -> UnetLayout:
        return UnetLayout.of(self.model)

    def _ferry_weights_key(self) -> str:
        # What Forge's LoraLoader compares to decide whether to merge again (its loaded_hash).
        return str(list(self.lora_patches.keys()))

    def _ferry_outside(self) -> list[nn.Module]:
        dm = self.model.diffusion_model
        return [m for m in self.model.children() if m is not dm]

    def _ferry_merge_loras(self) -> None:
        """Forge's own LoRA merge, on the plain network (the layout is released first)."""
        super().refresh_loras()  # type: ignore[misc]

    # -- ModelPatcher verbs ----------------------------------------------------------------
    def _ferry_mark_loading(self) -> None:
        self._ferry_layout().mark_loading(self.ferry_offload)

    def forge_patch_model(self, target_device: Any = None) -> nn.Module:
        if self.ferry_refusal is not None:
            # Raised here, not where it was found: see the module docstring.
            raise self.ferry_refusal.with_traceback(None)
        offload = self.ferry_offload
        assert offload is not None, "a Ferry patcher carries an offload or a refusal"
        # Forge asks for no device where it means to place the weights itself (its CPU swap);
        # Ferry places them on the load device either way.
        device = torch.device(self.load_device)
        layout = self._ferry_layout()
        layout.set_owner(self)
        try:
            changed = layout.ensure(
                offload, device, self._ferry_weights_key(), self._ferry_merge_loras
            )
        except ControlError:
            raise
        except ConfigError as e:
            raise as_control_error(e, saved=offload.from_saved) from None
        if changed:
            assert layout.handle is not None
            log.info("ferry: laid out %s\n%s", offload.name, layout.handle.plan.describe())
            print(f"Ferry: laid out {offload.name} ({layout.handle.plan.policy.tier_name} tier)")
        super().forge_patch_model(None)  # type: ignore[misc]  # object patches, no move
        for m in self._ferry_outside():
            m.to(device)
        self.current_device = device
        # What Forge may still place itself: nothing (see the module docstring).
        return nn.Module()

    def forge_unpatch_model(self, target_device: Any = None) -> None:
        layout = self._ferry_layout()
        release = target_device is not None or layout.should_release_on_detach(self)
        ending = self._ferry_ending(target_device)
        discarded = False
        if release and layout.release(ending):
            discarded = ending is Ending.DISCARD
            name = self.ferry_offload.name if self.ferry_offload else "unet"
            verb = "discarded (nothing read back)" if discarded else "released"
            print(f"Ferry: {verb} {name}")
        if not layout.live and not discarded:
            super().forge_unpatch_model(target_device)  # type: ignore[misc]
            return
        # Object patches only: a live layout's weights are Ferry's, a discarded one's are on
        # meta (nothing to move: the network is being thrown away).
        super().forge_unpatch_model(None)  # type: ignore[misc]

    def _ferry_ending(self, target_device: Any) -> Ending:
        """DISCARD for a full unload of a network no loaded checkpoint holds (a checkpoint
        switch: webui/loaded.py), so Ferry's copies are dropped unread; RESTORE otherwise."""
        if target_device is not None and not checkpoint_holds(self.model):
            return Ending.DISCARD
        return Ending.RESTORE

    def refresh_loras(self) -> None:
        # LoadedModel.model_load calls this after forge_patch_model, which merged this
        # patcher's LoRA set before laying out: Forge's loader then finds nothing to do. A
        # merge into a live layout would replace parameters under the engine, so a different
        # set releases the layout first (the next load lays it out again).
        layout = self._ferry_layout()
        if layout.live and layout.weights_key != self._ferry_weights_key():
            layout.release()
        super().refresh_loras()  # type: ignore[misc]


def ferry_patcher_class(base: type) -> type:
    """``base`` (Forge's UnetPatcher, or a subclass) with Ferry's loading in front."""
    return with_ferry(FerryPatcherMixin, base)


def ferry_clone(unet: Any, offload: ForgeOffload | None, refusal: FerryError | None = None) -> Any:
    """A clone of Forge's UNet patcher ``unet`` whose loads go through Ferry with ``offload``
    (or that refuses to load with ``refusal``, naming the control)."""
    if offload is None and refusal is None:
        raise ValueError("ferry_clone needs an offload or a refusal")
    if not hasattr(getattr(unet, "model", None), "diffusion_model"):
        raise ControlError("enabled", "this model has no UNet (diffusion_model) to offload")
    n = unet.clone()
    n.__class__ = ferry_patcher_class(type(unet))
    n.ferry_offload = offload
    n.ferry_refusal = refusal
    return n
