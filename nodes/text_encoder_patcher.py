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

from ..offload_core.sources.checkpoint_stream import CheckpointWeights
from ..seam.passes import mark_passes
from .patcher import FerryPatcherMixin

#: The methods through which ComfyUI runs a text encoder (comfy/sd.py, CLIP.encode_from_tokens
#: and encode_from_tokens_scheduled, on every core Ferry supports): each call is one pass.
#: Not ``generate`` (v0.33's LLM encoders): it runs the decoder once per new token, many
#: passes that one mark would fold into one; unmarked, it runs as before.
ENTRY_METHODS = ("encode_token_weights",)


class TextEncoderPatcherMixin(FerryPatcherMixin):
    @staticmethod
    def _ferry_network_of(model: Any) -> Any:
        return model if isinstance(model, torch.nn.Module) else None

    def _ferry_outside_modules(self) -> list[torch.nn.Module]:
        return []  # the patcher's model is the network: nothing lies outside it

    def _ferry_prepare(self, device_to: torch.device) -> CheckpointWeights | None:
        mark_passes(self.model, ENTRY_METHODS)
        return super()._ferry_prepare(device_to)


# A pack's clone that sets its own class back (ComfyUI-GGUF's CLIP patcher does) gets Ferry's
# class again from FerryClones.clone: this mixin, not the MODEL's, which FerryClones would pick
# for a subclass of it.
TextEncoderPatcherMixin.ferry_mixin = TextEncoderPatcherMixin
