"""Node "Ferry Offload CLIP Vision": CLIP_VISION -> CLIP_VISION whose image encoder streams
through Ferry while CLIPVisionEncode runs it (Wan image-to-video's clip_vision_h, ...).

Core's ClipVisionModel (comfy/clip_vision.py) holds the encoder (``model``) and its
``patcher``; ``encode_image`` loads the patcher and calls the encoder's forward, one pass:
the site (seam/site.py CLIP_VISION).
"""

from __future__ import annotations

from typing import Any

from comfy_api.latest import io

from ..seam.site import CLIP_VISION
from .offload_inputs import offload_schema
from .offload_node import FerryOffloadNode

NODE_ID = "FerryOffloadClipVision"  # stable forever: saved workflows refer to it


class FerryOffloadClipVision(FerryOffloadNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return offload_schema(
            NODE_ID, "Ferry Offload CLIP Vision",
            "Streams the CLIP vision encoder's layers group by group while it encodes an "
            "image, from pinned RAM, RAM or disk. Put it right after Load CLIP Vision.",
            io.ClipVision, "clip_vision", "CLIP vision model",
        )  # fmt: skip

    @classmethod
    def execute(cls, clip_vision: Any, use_panel_settings: bool, **widgets: Any) -> io.NodeOutput:
        name = type(getattr(clip_vision, "model", None)).__name__
        return cls.offload(clip_vision, CLIP_VISION, name, use_panel_settings, widgets)
