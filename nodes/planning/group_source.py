"""The file a Ferry node's disk tier may read its network's groups from in place, found from
the prompt: the same answer for the pre-flight (prompt_networks.py) and for the node's run
(offload_node.py), so the two cannot disagree on whether group files are written
(offload_core/planner/group_files.py says how many bytes).

Core's loaders keep no path on the model they load, so the run finds the file as the
pre-flight does: from the loader node upstream of the Ferry node, in the prompt. Ferry's own
loaders and ComfyUI-GGUF's keep their file on the network (the node's ``source_of``): the
pre-flight takes their file as the source. Any other loader's network is written.

A wrong "in place" costs a copy, never a wrong weight: the layout compares each group's bytes
with the file's once and writes those that differ. It would cost room the pre-flight did not
count, so a loader is listed here only where its network's tensors are the file's as stored.

Pure (no ComfyUI import): ``find`` says where a file is, so CI walks prompts of any shape.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

#: ``find(folder, file name)`` -> the file's full path, or None.
Find = Callable[[str, str], "str | None"]

#: Core loaders whose network holds its file's tensors as stored where its weight_dtype is
#: "default" (and the host does not cast them: the header tells the pre-flight that): the
#: folder and the input naming the file. One file each: a loader of several files (a dual
#: text encoder) has no one file to read from.
CORE_IN_PLACE: Mapping[str, tuple[str, str]] = {
    "UNETLoader": ("diffusion_models", "unet_name"),
    # The run reads these in place too (loader_files.py, issue 48): the pre-flight must count
    # no group file for them, or it refuses a folder the run would not write to.
    "CLIPLoader": ("text_encoders", "clip_name"),
    "ControlNetLoader": ("controlnet", "control_net_name"),
}
#: Loaders that keep their file on the network they load; the Ferry node reads it there
#: (Ferry's loaders: ``ferry_checkpoint``; UnetLoaderGGUF: seam/model_files.py's
#: ``gguf_file_of``). ComfyUI-GGUF's CLIP loaders keep none Ferry reads: written.
KEEPS_ITS_FILE = frozenset(
    {
        "FerryLoadDiffusionModelQuantized",
        "FerryLoadTextEncoder",
        "FerryLoadTextEncoderDual",
        "UnetLoaderGGUF",
        "UnetLoaderGGUFAdvanced",
    }
)


def _patches_weights(class_type: str) -> bool:
    """A node between the loader and the Ferry node that changes weights (a LoRA): its
    network's groups are no longer the file's."""
    return "lora" in class_type.lower()


def chain_to_loader(
    prompt: Mapping[str, Any], node_id: str, key: str, loaders: Mapping[str, Any]
) -> tuple[str | None, list[str]]:
    """The loader (one of ``loaders``' classes) the input ``key`` of ``node_id`` comes from,
    and the class of each node passed on the way (LoRA loaders, model patches), each followed
    by its own ``key`` input; (None, ...) where there is none."""
    seen: set[str] = set()
    passed: list[str] = []
    node = prompt.get(node_id)
    link = node.get("inputs", {}).get(key) if isinstance(node, dict) else None
    while isinstance(link, list) and link and str(link[0]) not in seen:
        src = str(link[0])
        seen.add(src)
        upstream = prompt.get(src)
        if not isinstance(upstream, dict):
            return None, passed
        if upstream.get("class_type") in loaders:
            return src, passed
        passed.append(str(upstream.get("class_type", "")))
        link = upstream.get("inputs", {}).get(key)
    return None, passed


def core_loader_file(
    prompt: Any, node_id: Any, key: str, find: Find, loaders: Mapping[str, Any]
) -> str | None:
    """The file a core loader upstream of the Ferry node ``node_id`` (its input ``key``) read,
    where the disk tier can read the network's groups from it (CORE_IN_PLACE); None: a
    loader not listed, a weight_dtype other than "default", a LoRA on the way, or the file
    not found. ``loaders``: every loader class the prompt walk knows (the chain stops at
    the first)."""
    if not isinstance(prompt, dict) or str(node_id) not in prompt:
        return None
    loader_id, passed = chain_to_loader(prompt, str(node_id), key, loaders)
    node = prompt.get(loader_id) if loader_id is not None else None
    if not isinstance(node, dict) or any(_patches_weights(c) for c in passed):
        return None
    spec = CORE_IN_PLACE.get(node.get("class_type", ""))
    inputs = node.get("inputs", {})
    if spec is None or inputs.get("weight_dtype", "default") != "default":
        return None
    name = inputs.get(spec[1])
    return find(spec[0], name) if isinstance(name, str) else None


def planned_source(
    prompt: dict[str, Any],
    ferry_id: str | None,
    key: str,
    loader_class: str,
    file: str | None,
    find: Find,
    loaders: Mapping[str, Any],
) -> str | None:
    """The pre-flight's source for a network of ``loader_class`` (its file ``file``) that the
    Ferry node ``ferry_id`` offloads through its input ``key``: what the run will be told
    (``core_loader_file`` for core's loaders, the loader's own file for those that keep it);
    None: its groups are written."""
    if ferry_id is None:
        return None
    if loader_class in KEEPS_ITS_FILE:
        _, passed = chain_to_loader(prompt, ferry_id, key, loaders)
        return None if any(_patches_weights(c) for c in passed) else file
    return core_loader_file(prompt, ferry_id, key, find, loaders)
