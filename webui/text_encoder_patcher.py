"""The patcher of a Forge CLIP (its text encoders) while Ferry holds it: Ferry's UNet patcher
(patcher.py), with one difference: where the network is.

A UNet's patcher holds a KModel, whose ``diffusion_model`` Ferry lays out and whose other
children go to the load device whole. A CLIP's patcher (``CLIP.patcher``, a plain
``ModelPatcher``: backend/patcher/clip.py) holds the ``JointTextEncoder`` itself (a ModuleDict
of ``clip_l``, ``clip_g``, ``t5xxl``), so the whole of it is the network: each encoder's
repeated layers (CLIP ``encoder.layers``, T5 ``block``) are groups at block level, and what
lies outside them (embeddings, final norms, projections) stays on the device. Forge loads it
with ``load_model_gpu(clip.patcher)`` at the start of ``get_learned_conditioning``; the LoRA
merge, the release on unload and the layout kept across clones are the UNet patcher's.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..offload_core import FerryError
from ..seam.passes import mark_passes
from ..seam.patcher_class import with_ferry
from .controls import ForgeOffload
from .layout import TextEncoderLayout
from .patcher import FerryPatcherMixin

#: The method each of Forge's text-processing engines runs its encoder through, once per
#: 75-token chunk (backend/text_processing/classic_engine.py, t5_engine.py): each call is one
#: pass. Not ``get_learned_conditioning``, which would hold every encoder in one pass: it
#: loads the CLIP first, so no layout exists yet when its first call begins.
ENTRY_METHOD = "encode_with_transformers"


class TextEncoderPatcherMixin(FerryPatcherMixin):
    def _ferry_layout(self) -> TextEncoderLayout:  # type: ignore[override]
        return TextEncoderLayout.of_encoder(self.model)

    def _ferry_outside(self) -> list[nn.Module]:
        return []  # the patcher's model is the network: nothing lies outside it


# Forge's ModelPatcher.clone builds a plain ModelPatcher: Ferry's clone puts this mixin (not
# the UNet's, which FerryClones would pick for a subclass) back in front.
TextEncoderPatcherMixin.ferry_mixin = TextEncoderPatcherMixin


def ferry_text_encoder_clone(
    clip: Any, offload: ForgeOffload | None, refusal: FerryError | None = None
) -> Any:
    """A clone of Forge's CLIP ``clip`` whose text encoders load through Ferry with
    ``offload`` (or whose load is refused with ``refusal``, naming the control). The clone
    shares ``cond_stage_model`` with ``clip``: Forge's text-processing engines hold its
    encoders, so it must be that module that Ferry lays out."""
    if offload is None and refusal is None:
        raise ValueError("ferry_text_encoder_clone needs an offload or a refusal")
    n = clip.clone()
    patcher = n.patcher
    patcher.__class__ = with_ferry(TextEncoderPatcherMixin, type(patcher))
    patcher.ferry_offload = offload
    patcher.ferry_refusal = refusal
    return n


def mark_encoder_passes(sd_model: Any, joint: nn.Module) -> int:
    """Marks each call of ``sd_model``'s text-processing engines whose encoder is part of
    ``joint`` as one pass of its layout (seam/passes.py); returns how many engines."""
    inside = {id(m) for m in joint.modules()}
    n = 0
    for engine in list(vars(sd_model).values()):
        encoder = getattr(engine, "text_encoder", None)
        if callable(getattr(engine, ENTRY_METHOD, None)) and id(encoder) in inside:
            mark_passes(joint, (ENTRY_METHOD,), on=engine)
            n += 1
    return n
