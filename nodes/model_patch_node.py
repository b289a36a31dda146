"""Node "Ferry Offload Model Patch": MODEL_PATCH -> MODEL_PATCH whose network streams through
Ferry: Qwen-Image's and Z-Image's block-wise ControlNets (ModelPatchLoader).

Core's MODEL_PATCH is the patcher itself (comfy_extras/nodes_model_patch.py); the node that
applies it (QwenImageDiffsynthControlnet, ...) adds a patch to the model that loads it with the
model and calls its blocks one by one: the site (seam/site.py MODEL_PATCH).
"""

from __future__ import annotations

from typing import Any

from comfy_api.latest import io

from ..seam.site import MODEL_PATCH
from .offload_inputs import offload_schema
from .offload_node import FerryOffloadNode

NODE_ID = "FerryOffloadModelPatch"  # stable forever: saved workflows refer to it


class FerryOffloadModelPatch(FerryOffloadNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return offload_schema(
            NODE_ID, "Ferry Offload Model Patch",
            "Streams a model patch's blocks (Qwen-Image's or Z-Image's block-wise ControlNet) "
            "group by group while the model runs it, from pinned RAM, RAM or disk. Put it "
            "right after Load Model Patch.",
            io.Custom("MODEL_PATCH"), "model_patch", "model patch",
        )  # fmt: skip

    @classmethod
    def execute(cls, model_patch: Any, use_panel_settings: bool, **widgets: Any) -> io.NodeOutput:
        name = type(getattr(model_patch, "model", None)).__name__
        return cls.offload(model_patch, MODEL_PATCH, name, use_panel_settings, widgets)
