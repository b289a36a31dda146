"""Node "Ferry Load Checkpoint": core's CheckpointLoaderSimple (its inputs read from the running
core), with the diffusion model's and the text encoders' weights left in the file until Ferry
Offload Model and Ferry Offload Text Encoder lay them out (loading/checkpoint_stream.py)."""

from __future__ import annotations

import importlib
import logging
from typing import Any

import folder_paths
from comfy_api.latest import io

from ..seam.site import TEXT_ENCODER
from .input_error import NodeInputError
from .loading.checkpoint_stream import WIDGET, Loaded, core_load_checkpoint, lazy_checkpoint
from .patcher.patcher import ferry_patcher, ferry_patcher_class

log = logging.getLogger("ferry")

NODE_ID = "FerryLoadCheckpoint"


def core_checkpoint_input() -> tuple[list[str], str]:
    """(the files, the tooltip) of core's CheckpointLoaderSimple's ``ckpt_name``, read from
    core's own top-level ``nodes`` module (not this pack's folder of the same name)."""
    core_nodes = importlib.import_module("nodes")
    files, options = core_nodes.CheckpointLoaderSimple.INPUT_TYPES()["required"][WIDGET]
    # As core lists them (not copied: the schema tests' stand-in list records its folder).
    return files, str(options.get("tooltip", "A file in models/checkpoints."))


class FerryLoadCheckpoint(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        files, tooltip = core_checkpoint_input()
        return io.Schema(
            node_id=NODE_ID,
            display_name="Ferry Load Checkpoint",
            category="Ferry",
            description="Load Checkpoint (CheckpointLoaderSimple), with the diffusion model's "
            "and the text encoders' weights left in the file: with Ferry Offload Model and "
            "Ferry Offload Text Encoder after it they are read group by group from that one "
            "file, so an all-in-one checkpoint bigger than your RAM runs (fp8 ones included); "
            "the VAE is loaded as core loads it. With any other node after it a network is "
            "read whole, as Load Checkpoint reads it.",
            inputs=[io.Combo.Input(WIDGET, options=files, tooltip=tooltip)],
            outputs=[
                io.Model.Output(tooltip="The diffusion model."),
                io.Clip.Output(tooltip="The text encoder(s) (CLIP)."),
                io.Vae.Output(tooltip="The VAE."),
            ],
        )

    @classmethod
    def execute(cls, ckpt_name: str) -> io.NodeOutput:
        path = folder_paths.get_full_path("checkpoints", ckpt_name)
        if path is None:
            raise NodeInputError(WIDGET, f"{ckpt_name!r} is not in models/checkpoints")
        loaded = load_checkpoint(path)
        return io.NodeOutput(loaded.model, loaded.clip, loaded.vae)


def load_checkpoint(path: str) -> Loaded:
    """The checkpoint's networks, left in the file where core needs no conversion of them,
    else core's own load (the log says why). Either way the MODEL's and the CLIP's patchers
    are Ferry's with no offload, so a plain load reads the weights whole, as core would."""
    embeddings = folder_paths.get_folder_paths("embeddings")
    loaded = lazy_checkpoint(path, embeddings)
    if loaded is None:
        log.warning(
            "ferry: %s needs ComfyUI's own conversion, so it is loaded whole into RAM, as "
            "Load Checkpoint loads it",
            path,
        )
        loaded = core_load_checkpoint(path, embeddings)
    model: Any = loaded.model
    if model is not None:
        model.__class__ = ferry_patcher_class(type(model))
    if loaded.clip is not None:
        ferry_patcher(loaded.clip.patcher, TEXT_ENCODER)
    return loaded
