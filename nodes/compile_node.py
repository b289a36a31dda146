"""Node "Ferry Compile Blocks": core's TorchCompileModel for the repeated blocks only (the
wrapper and its checks: patcher/block_compile.py)."""

from __future__ import annotations

import inspect
from typing import Any

from comfy.patcher_extension import WrappersMP
from comfy_api.latest import io

from ..offload_core.model.regional_compile import repeated_blocks
from .input_error import NodeInputError
from .patcher.block_compile import COMPILE_KEY, COMPILE_KWARGS, BlockCompile

NODE_ID = "FerryCompileBlocks"


def _plain_clone(model: Any) -> Any:
    # As core's TorchCompileModel: under dynamic VRAM (cores >= 0.15) the weights must not
    # move behind the compiled graph.
    if "disable_dynamic" in inspect.signature(model.clone).parameters:
        return model.clone(disable_dynamic=True)
    return model.clone()


class FerryCompileBlocks(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id=NODE_ID,
            display_name="Ferry Compile Blocks",
            category="Ferry",
            description="TorchCompileModel for the repeated blocks only: each block is "
            "compiled, one graph per kind of block, so it works with Ferry Offload Model "
            "(before or after it) and without it. Core's TorchCompileModel on a model Ferry "
            "streams does the same.",
            inputs=[
                io.Model.Input("model", tooltip="The diffusion model to compile."),
                io.Combo.Input(
                    "backend",
                    options=["inductor", "cudagraphs"],
                    tooltip="torch.compile's backend, as in TorchCompileModel. With Ferry "
                    "Offload Model only inductor works (CUDA graphs fix weight addresses).",
                ),
            ],
            outputs=[io.Model.Output(tooltip="The model, compiled block by block when it runs.")],
        )

    @classmethod
    def execute(cls, model: Any, backend: str) -> io.NodeOutput:
        dm = getattr(getattr(model, "model", None), "diffusion_model", None)
        if dm is None or not repeated_blocks(dm):
            raise NodeInputError(
                "model",
                "has no list of repeated blocks to compile; use TorchCompileModel for it",
            )
        m = _plain_clone(model)
        kwargs = {"backend": backend, "options": None, "mode": None, "fullgraph": False,
                  "dynamic": None}  # fmt: skip
        m.remove_wrappers_with_key(WrappersMP.APPLY_MODEL, COMPILE_KEY)
        m.model_options[COMPILE_KWARGS] = kwargs
        m.add_wrapper_with_key(WrappersMP.APPLY_MODEL, COMPILE_KEY, BlockCompile(m.model_options))
        return io.NodeOutput(m)
