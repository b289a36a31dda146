"""Node "Ferry Load Diffusion Model (quantized)": a diffusion_models file + a torchao preset."""

from __future__ import annotations

import comfy.model_management as mm
import comfy.utils
import folder_paths
from comfy_api.latest import io

from ..offload_core.quant import PRESETS
from .config import NodeInputError
from .quant_loader import check_preset, load_quantized_diffusion_model

NODE_ID = "FerryLoadDiffusionModelQuantized"


class FerryLoadDiffusionModelQuantized(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id=NODE_ID,
            display_name="Ferry Load Diffusion Model (quantized)",
            category="Ferry",
            description="Loads a model from models/diffusion_models and quantizes its Linear "
            "layers with torchao as they are read, so the full-precision model is never in RAM.",
            inputs=[
                io.Combo.Input(
                    "unet_name",
                    options=folder_paths.get_filename_list("diffusion_models"),
                    tooltip="A file in ComfyUI's models/diffusion_models folder.",
                ),
                io.Combo.Input(
                    "quant_preset",
                    options=list(PRESETS),
                    default="none",
                    tooltip="none: as saved. int8-weight / float8-weight: weights only (about "
                    "half the size of bf16). int8-dynamic: int8 matmuls. int4-weight and "
                    "float8-dynamic need a CUDA GPU (float8-dynamic: RTX 40xx / H100 or newer).",
                ),
                io.Boolean.Input(
                    "cache",
                    default=True,
                    tooltip="On: keep the quantized weights in models/ferry-cache so the next "
                    "load reads them instead of quantizing again.",
                ),
            ],
            outputs=[io.Model.Output(tooltip="The (quantized) diffusion model.")],
        )

    @classmethod
    def validate_inputs(cls, quant_preset: str) -> bool | str:
        try:
            check_preset(quant_preset, mm.get_torch_device())
        except NodeInputError as e:
            return str(e)
        return True

    @classmethod
    def execute(cls, unet_name: str, quant_preset: str, cache: bool) -> io.NodeOutput:
        path = folder_paths.get_full_path("diffusion_models", unet_name)
        if path is None:
            raise NodeInputError("unet_name", f"{unet_name!r} is not in models/diffusion_models")
        pbar = comfy.utils.ProgressBar(1)
        model = load_quantized_diffusion_model(
            path, quant_preset, cache, lambda done, total: pbar.update_absolute(done, total)
        )
        if quant_preset == "none":
            # Unchanged weights: the disk tier can read groups straight from this file.
            model.ferry_source_checkpoint = path
        return io.NodeOutput(model)
