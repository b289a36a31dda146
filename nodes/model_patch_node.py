"""Node "Ferry Offload Model Patch": MODEL_PATCH -> MODEL_PATCH whose network streams through
Ferry: Qwen-Image's and Z-Image's block-wise ControlNets (ModelPatchLoader).

Core's MODEL_PATCH is the patcher itself (comfy_extras/nodes_model_patch.py); the node that
applies it (QwenImageDiffsynthControlnet, ...) adds a patch to the model that loads it with the
model and calls its blocks one by one: the site (seam/site.py MODEL_PATCH).
"""

from __future__ import annotations

from comfy_api.latest import io

from ..seam.site import MODEL_PATCH
from .offload_inputs import NodeText
from .offload_node import FerryOffloadNode

NODE_ID = "FerryOffloadModelPatch"  # stable forever: saved workflows refer to it


class FerryOffloadModelPatch(FerryOffloadNode):
    SITE = MODEL_PATCH
    TEXT = NodeText(
        NODE_ID, "Ferry Offload Model Patch",
        "Streams a model patch's blocks (Qwen-Image's or Z-Image's block-wise ControlNet) group "
        "by group while the model runs it, from pinned RAM, RAM or disk. Put it right after "
        "Load Model Patch.",
        io.Custom("MODEL_PATCH"), MODEL_PATCH.what,  # core's class for it is named per version
    )  # fmt: skip
