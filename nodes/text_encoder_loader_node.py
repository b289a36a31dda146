"""Nodes "Ferry Load Text Encoder" and "Ferry Load Text Encoders (dual)": core's CLIPLoader and
DualCLIPLoader (the same inputs, read from the running core), with the encoders' weights left
in their files until Ferry Offload Text Encoder streams them (text_encoder_stream.py).

Two nodes rather than one with an optional second file: each has exactly the inputs and the
``type`` list of the core node it stands for, so a workflow swaps one for the other by its
class alone, and a single-file type is never offered beside a second file.
"""

from __future__ import annotations

from typing import Any

import folder_paths
from comfy_api.latest import io

from .loading.text_encoder_stream import load_text_encoder
from .patcher import comfy_core

DESCRIPTION = (
    "{core}, with the text encoder's weights left in the file: with Ferry Offload Text Encoder "
    "after it they are read group by group as it encodes (from the file itself on the disk "
    "tier), so a text encoder bigger than your RAM runs; with any other node after it the "
    "file is read whole, as {core} reads it."
)


def _inputs(core: str, names: list[str]) -> list[Any]:
    types, devices = comfy_core.clip_loader_choices(core)
    files = folder_paths.get_filename_list("text_encoders")
    out: list[Any] = [
        io.Combo.Input(n, options=files, tooltip="A file in models/text_encoders.") for n in names
    ]
    out.append(io.Combo.Input("type", options=types, tooltip=f"As {core}'s type."))
    if devices is not None:
        out.append(
            io.Combo.Input("device", options=devices, optional=True, tooltip=f"As {core}'s.")
        )
    return out


def _load(files: dict[str, str], type: str, device: str) -> io.NodeOutput:
    clip = load_text_encoder(
        files, comfy_core.clip_type(type), comfy_core.clip_model_options(device)
    )
    return io.NodeOutput(clip)


class FerryLoadTextEncoder(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="FerryLoadTextEncoder",
            display_name="Ferry Load Text Encoder",
            category="Ferry",
            description=DESCRIPTION.format(core="Load CLIP (CLIPLoader)"),
            inputs=_inputs("CLIPLoader", ["clip_name"]),
            outputs=[io.Clip.Output(tooltip="The text encoder (CLIP).")],
        )

    @classmethod
    def execute(cls, clip_name: str, type: str, device: str = "default") -> io.NodeOutput:
        return _load({"clip_name": clip_name}, type, device)


class FerryLoadTextEncoderDual(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="FerryLoadTextEncoderDual",
            display_name="Ferry Load Text Encoders (dual)",
            category="Ferry",
            description=DESCRIPTION.format(core="DualCLIPLoader"),
            inputs=_inputs("DualCLIPLoader", ["clip_name1", "clip_name2"]),
            outputs=[io.Clip.Output(tooltip="The text encoder (CLIP).")],
        )

    @classmethod
    def execute(
        cls, clip_name1: str, clip_name2: str, type: str, device: str = "default"
    ) -> io.NodeOutput:
        return _load({"clip_name1": clip_name1, "clip_name2": clip_name2}, type, device)
