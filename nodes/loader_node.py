"""Node "Ferry Load Diffusion Model (quantized)": a diffusion_models file + a torchao preset."""

from __future__ import annotations

import logging
from typing import Any

import comfy.model_management as mm
import comfy.utils
import folder_paths
from comfy_api.latest import io

from ..offload_core.formats.weight_dtypes import STORAGE_WEIGHT_DTYPES, WEIGHT_DTYPES
from ..offload_core.quant import PRESETS
from .input_error import NodeInputError
from .loading.quant_loader import check_preset, load_quantized_diffusion_model
from .loading.stream_loader import is_lazy, lazy_diffusion_model
from .patcher import comfy_core
from .patcher.patcher import ferry_patcher_class

log = logging.getLogger("ferry")

NODE_ID = "FerryLoadDiffusionModelQuantized"


class FerryLoadDiffusionModelQuantized(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id=NODE_ID,
            display_name="Ferry Load Diffusion Model (quantized)",
            category="Ferry",
            description="Loads a model from models/diffusion_models. With quant_preset none the "
            "weights stay in the file until Ferry Offload Model lays them out group by group, "
            "so models bigger than your RAM run; a preset quantizes the Linear layers with "
            "torchao as they are read (group by group as Ferry Offload Model lays them out "
            "when the quantized model would not fit in half the free RAM), so the "
            "full-precision model is never in RAM.",
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
                io.Combo.Input(
                    "weight_dtype",
                    options=list(STORAGE_WEIGHT_DTYPES),
                    default="default",
                    optional=True,
                    tooltip="As UNETLoader's weight_dtype (quant_preset none): default keeps "
                    "ComfyUI's choice; fp8_e4m3fn / fp8_e5m2 store the weights in 8 bits "
                    "(converted group by group into Ferry's files on the disk tier).",
                ),
                io.Boolean.Input(
                    "cache",
                    default=True,
                    tooltip="On: keep the quantized weights in models/ferry-cache so the next "
                    "load reads them instead of quantizing again (for a quantized model that "
                    "fits in half the free RAM; a bigger one is quantized group by group as "
                    "Ferry Offload Model lays it out, without the cache).",
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
    def execute(
        cls, unet_name: str, quant_preset: str, cache: bool, weight_dtype: str = "default"
    ) -> io.NodeOutput:
        path = folder_paths.get_full_path("diffusion_models", unet_name)
        if path is None:
            raise NodeInputError("unet_name", f"{unet_name!r} is not in models/diffusion_models")
        if quant_preset == "none":
            return io.NodeOutput(load_in_place(path, weight_dtype))
        if weight_dtype != "default":
            raise NodeInputError(
                "weight_dtype",
                f"applies to quant_preset none; set it to default for {quant_preset}",
            )
        pbar = comfy.utils.ProgressBar(1)
        model = load_quantized_diffusion_model(
            path, quant_preset, cache, lambda done, total: pbar.update_absolute(done, total)
        )
        if is_lazy(model.model):  # quantized as it is laid out (or read whole by a plain load)
            model.__class__ = ferry_patcher_class(type(model))
        return io.NodeOutput(model)


def load_in_place(path: str, weight_dtype: str) -> Any:
    """quant_preset none: a MODEL whose weights stay in ``path`` (see stream_loader.py);
    a file ComfyUI must convert is loaded whole, and the log says so."""
    model = lazy_diffusion_model(path, weight_dtype)
    if model is None:
        log.warning(
            "ferry: %s needs ComfyUI's own conversion (a diffusers layout, or a layer ComfyUI "
            "changes on the way), so it is loaded whole into RAM; save it in ComfyUI's plain "
            "layout to run it bigger than RAM",
            path,
        )
        dtype = WEIGHT_DTYPES[weight_dtype]
        model = comfy_core.load_diffusion_model(path, {"dtype": dtype} if dtype else {})
        # Unchanged weights: the disk tier can read groups straight from this file.
        model.ferry_source_checkpoint = path if dtype is None else None
    # Ferry's patcher with no offload: a plain load reads the weights whole, as UNETLoader.
    model.__class__ = ferry_patcher_class(type(model))
    return model
