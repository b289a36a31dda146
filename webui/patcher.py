"""A Forge patcher that loads its network through Ferry instead of moving it whole: the UNet's
(a UnetPatcher over a KModel) or the text encoders' (``CLIP.patcher``, a plain ModelPatcher
over the ``JointTextEncoder``): seam/site.py says where the network is on the patcher's model.

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
  the next patcher is Ferry's with the same offload (seam/live_layout.py's Note).
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
from ..seam.passes import mark_passes
from ..seam.patcher_class import FerryClones, with_ferry
from ..seam.site import DIFFUSION_MODEL, NetworkSite
from .controls import ControlError, ForgeOffload, as_control_error
from .live_layout import ForgeLayout
from .loaded import checkpoint_holds

log = logging.getLogger("ferry")


class FerryPatcherMixin(FerryClones):
    """Put in front of the network's own patcher class (see ``ferry_clone``)."""

    ferry_shared = ("ferry_offload", "ferry_refusal", "ferry_site")
    ferry_offload: ForgeOffload | None = None
    ferry_refusal: FerryError | None = None
    ferry_site: NetworkSite = DIFFUSION_MODEL
    # Forge's ModelPatcher sets these (declared for the type checker only).
    model: Any
    lora_patches: dict[Any, Any]
    load_device: Any
    current_device: Any

    # -- helpers ---------------------------------------------------------------------------
    def _ferry_layout(self) -> ForgeLayout:
        return ForgeLayout.of_patcher(self.model, self.ferry_site)

    def _ferry_weights_key(self) -> str:
        # What Forge's LoraLoader compares to decide whether to merge again (its loaded_hash).
        return str(list(self.lora_patches.keys()))

    def _ferry_merge_loras(self) -> None:
        """Forge's own LoRA merge, on the plain network (the layout is released first)."""
        super().refresh_loras()  # type: ignore[misc]

    # -- ModelPatcher verbs ----------------------------------------------------------------
    def _ferry_mark_loading(self) -> None:
        self._ferry_layout().handshake.mark_loading(self.ferry_offload)

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
        layout.handshake.set_owner(self)
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
            log.info("ferry: laid out %s\n%s", offload.title, layout.handle.plan.describe())
            print(f"Ferry: laid out {offload.name} ({layout.handle.plan.policy.tier_name} tier)")
        super().forge_patch_model(None)  # type: ignore[misc]  # object patches, no move
        for m in self.ferry_site.outside(self.model):
            m.to(device)
        self.current_device = device
        # What Forge may still place itself: nothing (see the module docstring).
        return nn.Module()

    def forge_unpatch_model(self, target_device: Any = None) -> None:
        layout = self._ferry_layout()
        release = target_device is not None or layout.handshake.should_release_on_detach(self)
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
    """``base`` (Forge's UnetPatcher, its CLIP's ModelPatcher, a subclass) with Ferry's
    loading in front."""
    return with_ferry(FerryPatcherMixin, base)


def ferry_clone(
    obj: Any,
    offload: ForgeOffload | None,
    site: NetworkSite = DIFFUSION_MODEL,
    refusal: FerryError | None = None,
) -> Any:
    """A clone of Forge's ``obj`` (``forge_objects.unet``, ``.clip``: ``site`` says where its
    patcher and network are) whose patcher loads through Ferry with ``offload``, or refuses
    to load with ``refusal`` (naming the control). A CLIP's clone shares ``cond_stage_model``
    with ``obj``: Forge's text-processing engines hold its encoders, so it must be that
    module that Ferry lays out."""
    if offload is None and refusal is None:
        raise ValueError("ferry_clone needs an offload or a refusal")
    control = site.forge_control or "enabled"
    if site.network_of(getattr(site.patcher_of(obj), "model", None)) is None:
        raise ControlError(control, f"this model has no {site.what} to offload")
    n = obj.clone()
    patcher = site.patcher_of(n)
    patcher.__class__ = ferry_patcher_class(type(patcher))
    patcher.ferry_offload, patcher.ferry_refusal, patcher.ferry_site = offload, refusal, site
    return n


def mark_engine_passes(sd_model: Any, network: nn.Module | None, methods: tuple[str, ...]) -> int:
    """Marks each call of ``sd_model``'s text-processing engines whose encoder is part of
    ``network`` as one pass of its layout (seam/passes.py): Forge runs each encoder through
    its engine's ``encode_with_transformers``, once per 75-token chunk (not through
    ``get_learned_conditioning``, which loads the CLIP first, so no layout exists yet when
    its first call begins). Returns how many engines."""
    if network is None:
        return 0
    inside = {id(m) for m in network.modules()}
    n = 0
    for engine in list(vars(sd_model).values()):
        encoder = getattr(engine, "text_encoder", None)
        names = [m for m in methods if callable(getattr(engine, m, None))]
        if names and id(encoder) in inside:
            mark_passes(network, names, on=engine)
            n += 1
    return n
