"""The file a core loader upstream of a Ferry node read the network from, by the prompt's own
loader inputs: core keeps no path on the model it loads, and (without dynamic VRAM, or for the
non-dynamic delegate Ferry drives) copies the weights out of the file's mapping, so the file is
found from the prompt, not from the weights.

A wrong answer costs nothing but a copy: the disk tier reads a group from the file only where
the file's header holds each of its tensors with its shape and dtype and the stored bytes are
the group's, compared once at layout (sources/origin.py: ``ModelOrigin``); a LoRA baked in
makes its groups differ, and they are written.

Pure (no ComfyUI import): ``find`` says where a file is, so CI walks prompts of any shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .prompt_networks import Find, _upstream_loader

#: Core's loaders whose network holds the file's tensors as stored (a cast, such as
#: UNETLoader's weight_dtype, makes every group differ: nothing to read in place): the
#: folder, and the inputs naming the network's file, in order.
IN_PLACE_LOADERS: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "UNETLoader": ("diffusion_models", ("unet_name",)),
    "CLIPLoader": ("text_encoders", ("clip_name",)),
    "DualCLIPLoader": ("text_encoders", ("clip_name1", "clip_name2")),
    "ControlNetLoader": ("controlnet", ("control_net_name",)),
}


def loader_files(prompt: Any, node_id: Any, key: str, find: Find) -> tuple[str, ...]:
    """The files the core loader that ``node_id``'s input ``key`` comes from (through LoRA
    loaders and other nodes passing the network on) read; () where there is none, it casts,
    or a file is not found."""
    if not isinstance(prompt, dict) or str(node_id) not in prompt:
        return ()
    loader = _upstream_loader(prompt, str(node_id), key)
    node = prompt.get(loader) if loader is not None else None
    spec = IN_PLACE_LOADERS.get(node.get("class_type", "")) if isinstance(node, dict) else None
    if node is None or spec is None:
        return ()
    inputs = node.get("inputs", {})
    if inputs.get("weight_dtype", "default") != "default":
        return ()
    folder, names = spec
    found = [find(folder, inputs.get(n)) if isinstance(inputs.get(n), str) else None for n in names]
    return tuple(f for f in found if f) if all(found) else ()
