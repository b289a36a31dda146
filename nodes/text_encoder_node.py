"""Node "Ferry Offload Text Encoder": CLIP -> CLIP whose text encoder streams through Ferry.

The same settings, checks and ModelPatcher live layout as Ferry Offload Model (offload_node.py,
patcher.py), applied to the CLIP's own patcher (``clip.patcher``, whose model is the text
encoder: seam/site.py's TEXT_ENCODER). The layout happens when CLIPTextEncode loads the encoder;
the conditioning is the same as without Ferry, to the bit.
"""

from __future__ import annotations

from typing import Any

from comfy_api.latest import io

from ..seam.site import TEXT_ENCODER
from .offload_inputs import NodeText
from .offload_node import FerryOffloadNode

NODE_ID = "FerryOffloadTextEncoder"  # stable forever: saved workflows refer to it


class FerryOffloadTextEncoder(FerryOffloadNode):
    # The widgets are Ferry Offload Model's (the same names, defaults and checks). Under dynamic
    # VRAM the patcher is the non-dynamic delegate's, over its own encoder: the CLIP encodes
    # with that one (the site's mirror, cond_stage_model).
    SITE = TEXT_ENCODER
    TEXT = NodeText(
        NODE_ID, "Ferry Offload Text Encoder",
        "Streams the text encoder's layers group by group while it encodes, from pinned RAM, "
        "RAM or disk, as Ferry Offload Model does for the diffusion model. Put it right after "
        "the CLIP loader; every encoder of a dual/triple CLIP is offloaded.",
        io.Clip, TEXT_ENCODER.what, "The text encoder (CLIP) to offload.",
    )  # fmt: skip

    @classmethod
    def name_of(cls, obj: Any) -> str:
        return text_encoder_name(obj)


def text_encoder_name(clip: Any) -> str:
    """The name on the encoder's line in the sidebar, the panel and the log (after its kind:
    "text encoder: clip_l + t5xxl"): the encoders the CLIP holds, by the names core gives
    them, or its class where it holds none by name."""
    te = clip.cond_stage_model
    encoders = [name for name, _ in te.named_children()]
    return " + ".join(encoders) if encoders else type(te).__name__
