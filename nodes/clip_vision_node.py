"""Node "Ferry Offload CLIP Vision": CLIP_VISION -> CLIP_VISION whose image encoder streams
through Ferry while CLIPVisionEncode runs it (Wan image-to-video's clip_vision_h, ...).

Core's ClipVisionModel (comfy/clip_vision.py) holds the encoder (``model``) and its
``patcher``; ``encode_image`` loads the patcher and calls the encoder's forward, one pass:
the site (seam/site.py CLIP_VISION).
"""

from __future__ import annotations

from comfy_api.latest import io

from ..seam.site import CLIP_VISION
from .offload_inputs import NodeText
from .offload_node import FerryOffloadNode

NODE_ID = "FerryOffloadClipVision"  # stable forever: saved workflows refer to it


class FerryOffloadClipVision(FerryOffloadNode):
    SITE = CLIP_VISION
    TEXT = NodeText(
        NODE_ID, "Ferry Offload CLIP Vision",
        "Streams the CLIP vision encoder's layers group by group while it encodes an image, "
        "from pinned RAM, RAM or disk. Put it right after Load CLIP Vision.",
        io.ClipVision, CLIP_VISION.what,
    )  # fmt: skip
