"""Where each kind of network sits on a host's object: the one answer to "which network".

A host hands Ferry an object (ComfyUI's MODEL, CLIP, CONTROL_NET, MODEL_PATCH, CLIP_VISION;
Forge's ``forge_objects.unet`` and ``.clip``). Somewhere on it is a patcher (the host's
ModelPatcher), and on the patcher's ``model`` is the network Ferry lays out; what else the
patcher's model holds lies *outside* the network and goes to the load device whole. A
``NetworkSite`` says all of that for one kind, so a host has one patcher mixin and one
``ferry_clone(..., site)``, and adding a kind of network is one row of the kind table
(offload_core/offload_kind.py: its words, whether it is read every step), one site here and one
node (or script part) per host. Attribute names are data: nothing here imports a host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from ..offload_core.offload_kind import OffloadKind


@dataclass(frozen=True)
class NetworkSite:
    """One kind of network on a host's object (see the module docstring)."""

    kind: OffloadKind  # its row of the kind table: its line's title, its words, its reads
    #: The attribute of the host's object that holds its patcher ("": the object is one).
    patcher: str = ""
    #: The attribute of the patcher's ``model`` that holds the network ("": the model is it).
    network: str = ""
    #: The attribute of the host's object that holds the network itself beside its patcher
    #: ("": none), pointed at the Ferry patcher's model (a delegate's, under dynamic VRAM).
    mirror: str = ""
    #: The host object's own copy verb ("": ``copy.copy``; it never copies the weights).
    copy: str = "clone"
    #: Methods the host calls instead of the network's forward, each call one pass
    #: (seam/passes.py); a host marks the ones its objects have.
    passes: tuple[str, ...] = ()
    #: The control that names it: ComfyUI's node input, Forge's accordion switch (None:
    #: Forge does not offload this kind).
    control: str = "model"
    forge_control: str | None = None
    #: Whether ``bake_lora`` applies (its node shows the widget): LoRA patches on GGUF weights
    #: computed once at layout. Only the diffusion model's: a text encoder's layers take inputs
    #: in dtypes of their own, and no other kind carries GGUF LoRA patches.
    bakes: bool = False

    def patcher_of(self, obj: Any) -> Any:
        """The patcher on the host's object ``obj`` (None where it holds none)."""
        return getattr(obj, self.patcher, None) if self.patcher else obj

    def network_of(self, model: Any) -> nn.Module | None:
        """The network on a patcher's ``model`` (None where it has none)."""
        net = getattr(model, self.network, None) if self.network else model
        return net if isinstance(net, nn.Module) else None

    def outside(self, model: Any) -> list[nn.Module]:
        """What the patcher's ``model`` holds beside the network (BaseModel's sigmas, ...):
        tiny, and the host expects it on the load device."""
        if not self.network or not isinstance(model, nn.Module):
            return []
        net = self.network_of(model)
        return [m for m in model.children() if m is not net]

    def title(self, name: str) -> str:
        return self.kind.line_title(name)

    @property
    def what(self) -> str:
        """The words an error or a tooltip names it by: "diffusion model"."""
        return self.kind.noun

    @property
    def planner_kind(self) -> OffloadKind:
        """What the planner calls it: the same row (offload_core/planner/facts.py's Kind)."""
        return self.kind


DIFFUSION_MODEL = NetworkSite(
    OffloadKind.MODEL, network="diffusion_model",
    control="model", forge_control="enabled", bakes=True,
)  # fmt: skip

#: ComfyUI runs a text encoder through ``encode_token_weights`` (comfy/sd.py, every core Ferry
#: supports), Forge through each text-processing engine's ``encode_with_transformers``
#: (once per 75-token chunk). Not ``generate`` (v0.33's LLM encoders): it runs the decoder
#: once per new token, many passes that one mark would fold into one.
TEXT_ENCODER = NetworkSite(
    OffloadKind.TEXT_ENCODER, patcher="patcher", mirror="cond_stage_model",
    passes=("encode_token_weights", "encode_with_transformers"), control="clip",
    forge_control="text_encoder",
)  # fmt: skip

#: ComfyUI's ControlNet (comfy/controlnet.py) wraps ``control_model`` in its own patcher,
#: which every ``copy()`` shares; the sampler loads it beside the model (``get_models``).
CONTROLNET = NetworkSite(
    OffloadKind.CONTROLNET, patcher="control_model_wrapped",
    mirror="control_model", copy="copy", control="control_net",
)  # fmt: skip

#: ComfyUI's MODEL_PATCH is the patcher itself (comfy_extras/nodes_model_patch.py); the
#: model's patches call its network's own methods per block (``control_block``, ...), so no
#: one call is a pass: its groups come in as each block runs.
MODEL_PATCH = NetworkSite(
    OffloadKind.MODEL_PATCH, control="model_patch",
)  # fmt: skip

#: ComfyUI's ClipVisionModel (comfy/clip_vision.py) holds ``model`` and its ``patcher``;
#: ``encode_image`` loads the patcher and calls the model's forward (one pass).
CLIP_VISION = NetworkSite(
    OffloadKind.CLIP_VISION, patcher="patcher", mirror="model", copy="",
    control="clip_vision",
)  # fmt: skip

#: One site per kind Ferry offloads, in the table's order (tests/test_seam_site.py).
SITES: tuple[NetworkSite, ...] = (
    DIFFUSION_MODEL,
    TEXT_ENCODER,
    CONTROLNET,
    MODEL_PATCH,
    CLIP_VISION,
)
