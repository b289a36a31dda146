"""The pack's V3 extension: its nodes, and its /ferry/ routes registered when ComfyUI loads it."""

from __future__ import annotations

from comfy_api.latest import ComfyExtension, io

from .checkpoint_loader_node import FerryLoadCheckpoint
from .clip_vision_node import FerryOffloadClipVision
from .compile_node import FerryCompileBlocks
from .controlnet_node import FerryOffloadControlNet
from .loader_node import FerryLoadDiffusionModelQuantized
from .model_patch_node import FerryOffloadModelPatch
from .offload_node import FerryOffloadModel
from .report_node import FerryMemoryReport
from .text_encoder_loader_node import FerryLoadTextEncoder, FerryLoadTextEncoderDual
from .text_encoder_node import FerryOffloadTextEncoder


def _register_routes() -> None:
    # ComfyUI adds its route table to the app after loading every pack, so adding ours now is
    # in time. (ComfyUI 0.3.x never calls on_load; newer ones do: register() is idempotent.)
    import server

    from .ui.routes import register

    register(server.PromptServer.instance.routes)


class FerryExtension(ComfyExtension):
    async def on_load(self) -> None:
        _register_routes()

    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        _register_routes()
        return [
            FerryOffloadModel,
            FerryOffloadTextEncoder,
            FerryOffloadControlNet,
            FerryOffloadModelPatch,
            FerryOffloadClipVision,
            FerryLoadDiffusionModelQuantized,
            FerryLoadTextEncoder,
            FerryLoadTextEncoderDual,
            FerryLoadCheckpoint,
            FerryMemoryReport,
            FerryCompileBlocks,
        ]
