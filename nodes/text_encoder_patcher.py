"""The patcher of a CLIP (a text encoder) while Ferry holds it: Ferry Offload Model's patcher
(patcher.py), with one difference: where the network is.

A MODEL's patcher holds a BaseModel, whose ``diffusion_model`` Ferry lays out and whose other
children (model_sampling, ...) go to the load device whole. A CLIP's patcher (``clip.patcher``)
holds the text encoder itself (``clip.cond_stage_model``: SD3ClipModel, FluxClipModel,
HunyuanVideoClipModel, ...), so the whole of it is the network: each encoder's repeated layers
(T5 ``encoder.block``, CLIP ``encoder.layers``, Llama/Qwen/Gemma ``layers``) are groups at block
level, and what lies outside them (embeddings, final norms, projections) stays on the device.
Everything else (the binding kept across prompts, release on unload, LoRA baked in as core
computes it, the anchor, the hold) is Ferry Offload Model's, unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

from ..seam.patcher_class import keep_ferry_class
from .patcher import FerryPatcherMixin


class TextEncoderPatcherMixin(FerryPatcherMixin):
    @staticmethod
    def _ferry_network_of(model: Any) -> Any:
        return model if isinstance(model, torch.nn.Module) else None

    def _ferry_outside_modules(self) -> list[torch.nn.Module]:
        return []  # the patcher's model is the network: nothing lies outside it

    def clone(self, *args: Any, **kwargs: Any) -> Any:
        # A pack's clone that sets its own class back (ComfyUI-GGUF's CLIP patcher does) gets
        # Ferry's class again from FerryPatcherMixin.clone; this keeps the text encoder's.
        return keep_ferry_class(super().clone(*args, **kwargs), TextEncoderPatcherMixin)
