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

import os
from collections.abc import Mapping
from typing import Any

from ...offload_core.units import fmt_bytes
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


#: Ferry's loader that reads the same file without copying it into RAM first (by its name in
#: the node list), for each core loader above.
FERRY_LOADER_FOR: Mapping[str, str] = {
    "UNETLoader": "Ferry Load Diffusion Model (quantized) with quant_preset none",
    "CLIPLoader": "Ferry Load Text Encoder",
    "DualCLIPLoader": "Ferry Load Text Encoders (dual)",
}


def upstream_loader(prompt: Any, node_id: Any, key: str) -> tuple[str, dict[str, Any]] | None:
    """The class and inputs of the loader ``node_id``'s input ``key`` comes from."""
    if not isinstance(prompt, dict) or str(node_id) not in prompt:
        return None
    loader = _upstream_loader(prompt, str(node_id), key)
    node = prompt.get(loader) if loader is not None else None
    if not isinstance(node, dict):
        return None
    return str(node.get("class_type", "")), dict(node.get("inputs", {}))


def copy_note(loader: str, files: tuple[str, ...], file_bytes: int, network_bytes: int) -> str:
    """What a core that reads the file whole into RAM before building the network (ComfyUI
    before v0.15's mapped loads: v0.3.64, v0.8) costs, and the change: the file's bytes and
    the network's held together while it loads (facts.md: UNETLoader's peak was 2.1x)."""
    names = " + ".join(os.path.basename(f) for f in files)
    change = FERRY_LOADER_FOR.get(loader)
    instead = (
        f"use {change} instead: it streams the file, and Ferry reads it in place"
        if change
        else "Ferry has no loader of its own for it"
    )
    return (
        f"{loader} reads {names} whole into RAM before Ferry runs: about "
        f"{fmt_bytes(file_bytes + network_bytes)} at its peak while it loads (the file's "
        f"{fmt_bytes(file_bytes)} and the network's {fmt_bytes(network_bytes)}); {instead}"
    )


def loader_files(prompt: Any, node_id: Any, key: str, find: Find) -> tuple[str, ...]:
    """The files the core loader that ``node_id``'s input ``key`` comes from (through LoRA
    loaders and other nodes passing the network on) read; () where there is none, it casts,
    or a file is not found."""
    found = upstream_loader(prompt, node_id, key)
    if found is None or found[1].get("weight_dtype", "default") != "default":
        return ()
    return named_files(found, find)


def named_files(loader: tuple[str, dict[str, Any]], find: Find) -> tuple[str, ...]:
    """The files a core loader of ``IN_PLACE_LOADERS`` (its class and inputs) names; ()
    for another loader, or where a file is not found."""
    spec = IN_PLACE_LOADERS.get(loader[0])
    if spec is None:
        return ()
    inputs = loader[1]
    folder, names = spec
    found = [find(folder, inputs.get(n)) if isinstance(inputs.get(n), str) else None for n in names]
    return tuple(f for f in found if f) if all(found) else ()
