"""Node "Ferry Offload ControlNet": CONTROL_NET -> CONTROL_NET whose network streams through
Ferry while the sampler runs it beside the model, every step.

Core's ControlNet (comfy/controlnet.py) holds its network in its own patcher
(``control_model_wrapped``), which the sampler loads with the model (``get_models``) and
which every ``copy()`` shares (ControlNetApplyAdvanced copies it): the site (seam/site.py
CONTROLNET) puts Ferry's patcher there. T2I adapters and Control-LoRAs build no such patcher
when they load: the node refuses them by name.
"""

from __future__ import annotations

from comfy_api.latest import io

from ..seam.site import CONTROLNET
from .offload_inputs import NodeText
from .offload_node import FerryOffloadNode

NODE_ID = "FerryOffloadControlNet"  # stable forever: saved workflows refer to it


class FerryOffloadControlNet(FerryOffloadNode):
    SITE = CONTROLNET
    TEXT = NodeText(
        NODE_ID, "Ferry Offload ControlNet",
        "Streams the ControlNet's blocks group by group while it runs beside the model, from "
        "pinned RAM, RAM or disk, as Ferry Offload Model does for the diffusion model. Put it "
        "right after the ControlNet loader.",
        io.ControlNet, CONTROLNET.what,
    )  # fmt: skip
