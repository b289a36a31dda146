"""The networks a queued prompt loads, read from the prompt (API format) and their files'
headers alone: which loader loads which file, which Ferry node (if any) offloads it, and
how often a prompt reads it.

Pure (no ComfyUI import): where a file is and how the host casts it come in as functions,
so CI walks prompts of any shape (tests/test_prompt_networks.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from ...offload_core.errors import ConfigError
from ...offload_core.formats.weight_dtypes import WEIGHT_DTYPES
from ...offload_core.offload_kind import OffloadKind
from ...offload_core.planner.facts import Kind, NetworkFacts
from ...offload_core.planner.group_files import group_files
from ...offload_core.planner.loader_costs import LoaderCost
from ...offload_core.planner.network_file import network_from_file
from ...offload_core.planner.stored_sizes import CORE_FORMATS
from ...seam import site
from .group_source import planned_source


@dataclass(frozen=True)
class Loader:
    kind: Kind
    folder: str
    files: tuple[str, ...]  # the inputs naming a file, in order
    #: Where this network's tensors are in the file: the first prefix that has any (a
    #: checkpoint holds three networks, each under its own prefix, which differ by family).
    prefixes: tuple[str, ...] = ("",)


def _one(kind: Kind, folder: str, *files: str) -> tuple[Loader, ...]:
    return (Loader(kind, folder, files),)


#: Checkpoint loaders: the diffusion model, the text encoders and the VAE in one file.
MODEL, TEXT_ENCODER, VAE = OffloadKind.MODEL, OffloadKind.TEXT_ENCODER, OffloadKind.VAE
_CHECKPOINT = (
    Loader(MODEL, "checkpoints", ("ckpt_name",), ("model.diffusion_model.",)),
    Loader(TEXT_ENCODER, "checkpoints", ("ckpt_name",),
           ("conditioner.embedders.", "cond_stage_model.", "text_encoders.")),
    Loader(VAE, "checkpoints", ("ckpt_name",), ("first_stage_model.", "vae.")),
)  # fmt: skip
#: The loaders whose files the planner reads (core's, Ferry's, ComfyUI-GGUF's): the networks
#: each one's outputs carry.
LOADERS: Mapping[str, tuple[Loader, ...]] = {
    "UNETLoader": _one(MODEL, "diffusion_models", "unet_name"),
    "FerryLoadDiffusionModelQuantized": _one(MODEL, "diffusion_models", "unet_name"),
    "UnetLoaderGGUF": _one(MODEL, "unet", "unet_name"),
    "UnetLoaderGGUFAdvanced": _one(MODEL, "unet", "unet_name"),
    "CheckpointLoaderSimple": _CHECKPOINT,
    "FerryLoadCheckpoint": _CHECKPOINT,
    "CLIPLoader": _one(TEXT_ENCODER, "text_encoders", "clip_name"),
    "FerryLoadTextEncoder": _one(TEXT_ENCODER, "text_encoders", "clip_name"),
    "DualCLIPLoader": _one(TEXT_ENCODER, "text_encoders", "clip_name1", "clip_name2"),
    "FerryLoadTextEncoderDual": _one(TEXT_ENCODER, "text_encoders", "clip_name1", "clip_name2"),
    "TripleCLIPLoader": _one(
        TEXT_ENCODER, "text_encoders", "clip_name1", "clip_name2", "clip_name3"
    ),
    "CLIPLoaderGGUF": _one(TEXT_ENCODER, "clip", "clip_name"),
    "DualCLIPLoaderGGUF": _one(TEXT_ENCODER, "clip", "clip_name1", "clip_name2"),
    # Listed for its RAM: the plan's peak counts it (no Ferry node offloads a VAE).
    "VAELoader": _one(VAE, "vae", "vae_name"),
    "ControlNetLoader": _one(OffloadKind.CONTROLNET, "controlnet", "control_net_name"),
    "DiffControlNetLoader": _one(OffloadKind.CONTROLNET, "controlnet", "control_net_name"),
    "ModelPatchLoader": _one(OffloadKind.MODEL_PATCH, "model_patches", "name"),
    "CLIPVisionLoader": _one(OffloadKind.CLIP_VISION, "clip_vision", "clip_name"),
}
#: Ferry's offload nodes (their ids, stable forever) and their sites: the input a node's
#: network comes in on (the site's control) and what that network is (the site's kind).
_FERRY_SITES: Mapping[str, site.NetworkSite] = {
    "FerryOffloadModel": site.DIFFUSION_MODEL,
    "FerryOffloadTextEncoder": site.TEXT_ENCODER,
    "FerryOffloadControlNet": site.CONTROLNET,
    "FerryOffloadModelPatch": site.MODEL_PATCH,
    "FerryOffloadClipVision": site.CLIP_VISION,
}
FERRY_NODES: Mapping[str, tuple[str, Kind]] = {
    node: (s.control, s.kind) for node, s in _FERRY_SITES.items()
}
#: Samplers whose steps say how often a prompt reads the diffusion model.
SAMPLERS = ("KSampler", "KSamplerAdvanced")
DEFAULT_STEPS = 20

#: ``find(folder, file name)`` -> the file's full path, or None.
Find = Callable[[str, str], "str | None"]
#: ``cast(kind)`` -> how the host loads that kind's floating weights: a dtype, None (as
#: stored), or a rule of the file's dtype and size (``network_from_file``'s ``cast``).
Cast = Callable[[Kind], "torch.dtype | Callable[[torch.dtype, int], torch.dtype | None] | None"]
#: ``costs(loader class)`` -> its RAM while loading on this host and the sentence saying it,
#: or None (no row).
Costs = Callable[[str], "tuple[LoaderCost, str] | None"]


@dataclass(frozen=True)
class PromptNetwork:
    """One network of the prompt: its loader's node, the Ferry node offloading it (None:
    none), its files and its figures."""

    loader_id: str
    ferry_id: str | None
    files: tuple[str, ...]
    facts: NetworkFacts
    #: Whether the host holds its weights as the file stores them (the header's view: no
    #: cast, no conversion), whether or not the disk tier can read them in place (``facts``).
    as_stored: bool = True


def _upstream_loader(prompt: dict[str, Any], node_id: str, key: str) -> str | None:
    """The loader the input ``key`` of ``node_id`` comes from, through nodes that pass a
    network on (LoRA loaders, model patches): each is followed by its own ``key`` input."""
    seen: set[str] = set()
    link = prompt[node_id].get("inputs", {}).get(key)
    while isinstance(link, list) and link and str(link[0]) not in seen:
        src = str(link[0])
        seen.add(src)
        node = prompt.get(src) or {}
        if node.get("class_type") in LOADERS:
            return src
        link = node.get("inputs", {}).get(key)
    return None


def sampler_steps(prompt: dict[str, Any]) -> int | None:
    """The steps of the sampler that reads the diffusion model most (``reads_per_prompt``'s);
    None where the prompt has no sampler of ours to count."""
    best: tuple[float, int] | None = None
    for node in prompt.values():
        inputs = node.get("inputs", {}) if isinstance(node, dict) else {}
        steps = inputs.get("steps")
        if node.get("class_type") in SAMPLERS and isinstance(steps, int) and steps > 0:
            cfg = inputs.get("cfg", 1.0)
            reads = steps * (1 if isinstance(cfg, (int, float)) and cfg == 1.0 else 2)
            if best is None or reads > best[0]:
                best = (reads, steps)
    return None if best is None else best[1]


def reads_per_prompt(prompt: dict[str, Any]) -> float:
    """How often a prompt reads the diffusion model: each sampler's steps, twice a step
    where its cfg is not 1 (the negative prompt runs too); the largest sampler's."""
    reads = []
    for node in prompt.values():
        inputs = node.get("inputs", {})
        if node.get("class_type") in SAMPLERS and isinstance(inputs.get("steps"), int):
            cfg = inputs.get("cfg", 1.0)
            passes = 1 if isinstance(cfg, (int, float)) and cfg == 1.0 else 2
            reads.append(float(inputs["steps"] * passes))
    return max(reads, default=float(DEFAULT_STEPS * 2))


def _part(
    path: str, spec: Loader, name: str, rule: Any, widget: str, how: tuple[Any, Any]
) -> NetworkFacts | None:
    """The network ``spec`` finds in ``path`` under its first prefix that has tensors;
    ``how``: its loader's torchao preset and the quantized formats the host keeps."""
    for prefix in spec.prefixes:
        facts = network_from_file(
            path, name=name, kind=spec.kind, prefix=prefix, cast=rule, setting=widget,
            preset=how[0], keeps=how[1],
        )  # fmt: skip
        if facts.nbytes:
            return facts
    return None


def _facts(
    loader_id: str,
    node: dict[str, Any],
    spec: Loader,
    find: Find,
    cast: Cast,
    keeps: Collection[str] = CORE_FORMATS,
) -> NetworkFacts | None:
    """The network ``spec`` reads from the loader node's files (None: none of its tensors
    are there, e.g. a checkpoint without a VAE)."""
    # A loader's weight_dtype widget (UNETLoader's, Ferry's loader's), where it names one.
    rule = WEIGHT_DTYPES.get(node.get("inputs", {}).get("weight_dtype")) or cast(spec.kind)
    # Ferry's quantizing loader: its preset's Linears count at the preset's bytes.
    preset = node.get("inputs", {}).get("quant_preset")
    preset = preset if isinstance(preset, str) else None
    parts = []
    for widget in spec.files:
        name = node.get("inputs", {}).get(widget)
        path = find(spec.folder, name) if isinstance(name, str) else None
        if path is None:
            raise ConfigError(widget, f"{name!r} is not in models/{spec.folder} (node {loader_id})")
        stem = os.path.splitext(os.path.basename(name))[0]  # type: ignore[arg-type]
        part = _part(path, spec, stem, rule, widget, (preset, keeps))
        if part is not None:
            parts.append(part)
    if not parts:
        return None
    return replace(
        parts[0],
        name=" + ".join(p.name for p in parts),
        nbytes=sum(p.nbytes for p in parts),
        block_bytes=tuple(b for p in parts for b in p.block_bytes),
        longest_list=max(p.longest_list or len(p.block_bytes) for p in parts),
        in_place=all(p.in_place for p in parts),
        transient_bytes=max(p.transient_bytes for p in parts),
        file=" + ".join(p.file or "" for p in parts),
    )


def _in_place(
    prompt: dict[str, Any], ferry_id: str | None, loader: str, facts: NetworkFacts, find: Find
) -> bool:
    """Whether the disk tier reads the network in place: the same answer the run takes
    (group_source.py for the file, planner/group_files.py for the bytes); ``facts.in_place``
    says, from the header, whether the host holds it as its file stores it."""
    key = FERRY_NODES[prompt[ferry_id]["class_type"]][0] if ferry_id else ""
    source = planned_source(prompt, ferry_id, key, loader, facts.file, find, LOADERS)
    return group_files(source, [(facts.nbytes, facts.in_place)]).in_place


def _with_load_cost(
    facts: NetworkFacts, loader: str, files: tuple[str, ...], costs: Costs
) -> NetworkFacts:
    """``facts`` with the RAM its loader takes while it reads its files, where known."""
    known = costs(loader)
    if known is None:
        return facts
    cost, said = known
    stored = sum(os.path.getsize(f) for f in files if f and os.path.isfile(f))
    return replace(facts, load_peak_bytes=int(cost.peak * stored), load_said=said)


def prompt_networks(
    prompt: dict[str, Any],
    find: Find,
    cast: Cast,
    keeps: Collection[str] = CORE_FORMATS,
    costs: Costs = lambda loader: None,
) -> list[PromptNetwork]:
    """Every network ``prompt`` loads, Ferry's or not: diffusion models, text encoders,
    ControlNets, model patches, CLIP vision models, VAEs. ``keeps``: core's quantized
    formats this host loads as such (planner/stored_sizes.py); ``costs``: each loader's
    RAM while it loads on this host (planner/loader_costs.py). What a network's Ferry node
    asks for is its planner's to read (``ferry_id``'s widgets; graph_plan.py parses each
    once): each network's wish here is the default, nothing asked."""
    if not isinstance(prompt, dict):
        raise ConfigError(
            "prompt", "send the workflow in API format: {node id: {class_type, inputs}}"
        )
    ferry_of: dict[tuple[str, str], str] = {}
    for node_id, node in prompt.items():
        key, kind = (
            FERRY_NODES.get(node.get("class_type", ""), ("", ""))
            if isinstance(node, dict)
            else ("", "")
        )
        loader = _upstream_loader(prompt, node_id, key) if key else None
        if loader is not None:
            ferry_of.setdefault((loader, kind), node_id)
    steps = reads_per_prompt(prompt)
    out = []
    for loader_id, node in prompt.items():
        specs = LOADERS.get(node.get("class_type", "")) if isinstance(node, dict) else None
        for spec in specs or ():
            facts = _facts(loader_id, node, spec, find, cast, keeps)
            if facts is None:
                continue
            ferry_id = ferry_of.get((loader_id, spec.kind))
            reads = steps if facts.kind.per_step else 1.0
            as_stored = facts.in_place  # the header's view, before the disk tier's answer
            facts = replace(
                facts,
                ferry=ferry_id is not None,
                reads_per_prompt=reads,
                in_place=_in_place(prompt, ferry_id, node["class_type"], facts, find),
            )
            files = tuple((facts.file or "").split(" + "))
            facts = _with_load_cost(facts, node["class_type"], files, costs)
            out.append(PromptNetwork(loader_id, ferry_id, files, facts, as_stored))
    return sorted(out, key=lambda n: (n.facts.kind.plan_order, n.loader_id))
