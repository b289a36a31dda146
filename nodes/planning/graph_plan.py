"""The planner in ComfyUI: a queued prompt's networks (prompt_networks.py) planned together
on this machine as core counts it, once per prompt, for every Ferry node of the prompt and
for the pre-flight route alike (``plan_prompt``).

Core's figures: free VRAM as ``comfy.model_management.get_free_memory`` counts it (what its
own models could free included), the pin limit ``MAX_PINNED_MEMORY`` (core pins nothing
where it is <= 0), the dtype core loads each kind in. The RAM that live Ferry layouts hold
counts as available: a prompt that plans them again replaces or keeps them.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import comfy.model_management as mm
import comfy.utils
import folder_paths
import torch

from ...offload_core.offload_kind import OffloadKind
from ...offload_core.planner import Choice, GraphPlan, MachineFacts, disk_speed, plan_graph
from ...offload_core.planner.facts import Kind, Wish
from ...offload_core.planner.loader_costs import LoaderCost, load_sentence, loader_cost
from ...offload_core.planner.machine import read_machine
from ...offload_core.runtime.memory import process_memory
from ...offload_core.tools.monitor import read_offloads
from ..input_error import NodeInputError
from ..patcher.comfy_core import core_copies_model_files
from .config import NodeSettings
from .loader_files import IN_PLACE_LOADERS, copy_note
from .loader_swap import ferry_loader, registered_widgets
from .prompt_networks import FERRY_NODES, PromptNetwork, prompt_networks, sampler_steps

log = logging.getLogger("ferry")


@dataclass(frozen=True)
class PromptPlan:
    """A prompt's networks and their plan, and what its Ferry nodes asked for: ``settings``,
    each node's widgets parsed (a node on use_panel_settings has none), and ``choices``, the
    planner's choice for each Ferry node's network (by node id: a node reads its own)."""

    networks: tuple[PromptNetwork, ...]
    plan: GraphPlan
    settings: Mapping[str, NodeSettings]
    choices: Mapping[str, Choice]
    #: Loader node id -> its "Use Ferry's loader" entry (loader_swap.py), for core loaders.
    swaps: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    #: Per network: what its core loader costs where it copies the file first (loader_note).
    loader_notes: tuple[str | None, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        body = self.plan.as_dict()
        for entry, n in zip(body["networks"], self.networks):
            entry.update(loader_node=n.loader_id, ferry_node=n.ferry_id, files=list(n.files))
            entry["ferry_loader"] = self.swaps.get(n.loader_id)
        for entry, note in zip(body["networks"], self.loader_notes):
            entry["loader_note"] = note
        return body


def _cast(kind: Kind) -> Callable[[torch.dtype, int], torch.dtype | None]:
    """The dtype core loads a file's floating weights in, as its loaders choose it."""
    device = mm.get_torch_device()

    def rule(stored: torch.dtype, params: int) -> torch.dtype | None:
        if kind == OffloadKind.MODEL:
            return mm.unet_dtype(device, model_params=params, weight_dtype=stored)  # type: ignore[no-any-return]
        if kind == OffloadKind.CONTROLNET:  # comfy/controlnet.py controlnet_config: no params
            return mm.unet_dtype(device, model_params=-1, weight_dtype=stored)  # type: ignore[no-any-return]
        if kind == OffloadKind.VAE:
            return mm.vae_dtype(device)  # type: ignore[no-any-return]
        if kind == OffloadKind.CLIP_VISION:  # comfy/clip_vision.py, whatever the file holds
            return mm.text_encoder_dtype(device)  # type: ignore[no-any-return]
        if kind == OffloadKind.TEXT_ENCODER and stored.itemsize > 1:  # fp8 keeps its storage
            return mm.text_encoder_dtype(device)  # type: ignore[no-any-return]
        return None  # as stored: ModelPatchLoader's rule, and a kind core has no rule for

    return rule


def _keeps() -> tuple[str, ...]:
    """Core's quantized formats this core loads as such: fp8_scaled always; comfy_quant from
    v0.8 (``convert_old_quants``): v0.3.64 loads such a file's weights into plain layers."""
    return ("fp8_scaled", "comfy_quant") if hasattr(comfy.utils, "convert_old_quants") else (
        "fp8_scaled",
    )  # fmt: skip


def _loader_cost(loader: str) -> tuple[LoaderCost, str] | None:
    """``loader``'s RAM while it loads on this core and its sentence (loader_costs.py)."""
    try:
        from comfyui_version import __version__  # ComfyUI's root module: the core's version
    except ImportError:
        return None
    cost = loader_cost(loader, str(__version__))
    said = load_sentence(loader, str(__version__))
    return None if cost is None or said is None else (cost, said)


def loader_note(prompt: dict[str, Any], network: PromptNetwork) -> str | None:
    """What the network's core loader costs where this core copies the file into RAM first,
    and Ferry's loader that does not (None: it does not, or it is not such a loader)."""
    node = prompt.get(network.loader_id)
    loader = node.get("class_type") if isinstance(node, dict) else None
    if not core_copies_model_files() or loader not in IN_PLACE_LOADERS:
        return None
    files = tuple(f for f in network.files if f)
    size = sum(os.path.getsize(f) for f in files if os.path.isfile(f))
    return copy_note(str(loader), files, size, network.facts.nbytes)


def find_model_file(folder: str, name: str) -> str | None:
    """The full path of the model file ``name`` in ComfyUI's ``folder``; None: not there."""
    try:
        return folder_paths.get_full_path(folder, name)  # type: ignore[no-any-return]
    except KeyError:  # a folder name this core does not know (a pack's, not installed)
        return None


def _registered(ferry_class: str) -> dict[str, list[Any] | None] | None:
    """A node's widgets as this server lists them in /object_info (None: not registered):
    read from core's own top-level ``nodes`` module (not this pack's folder of that name)."""
    cls = importlib.import_module("nodes").NODE_CLASS_MAPPINGS.get(ferry_class)
    return None if cls is None else registered_widgets(cls.INPUT_TYPES())


def _swaps(prompt: dict[str, Any], networks: list[PromptNetwork]) -> dict[str, dict[str, Any]]:
    """Each core loader's "Use Ferry's loader" entry, with the Ferry nodes after it. Core's
    loader holds a network in RAM where this core copies the file, or where it converts the
    weights (the bytes it holds are not the file's: not ``as_stored``)."""
    copies = core_copies_model_files()
    after: dict[str, list[str]] = {}
    holds: dict[str, bool] = {}
    for n in networks:
        holds[n.loader_id] = holds.get(n.loader_id, copies) or not n.as_stored
        ferry = after.setdefault(n.loader_id, [])
        title = (
            re.sub(r"(?<=[a-z])(?=[A-Z])", " ", prompt[n.ferry_id]["class_type"])
            if n.ferry_id
            else None
        )
        if title and title not in ferry:
            ferry.append(title)
    out = {}
    for loader_id, ferry in after.items():
        entry = ferry_loader(loader_id, prompt[loader_id], ferry, _registered, holds[loader_id])
        if entry is not None:
            out[loader_id] = entry
    return out


def _pin_limit() -> int | None:
    limit = getattr(mm, "MAX_PINNED_MEMORY", None)
    return None if limit is None else max(0, int(limit))


def _live_host_ram() -> int:
    """RAM the live Ferry layouts hold in their pinned and RAM tiers."""
    total = 0
    for o in read_offloads():
        tiers = o.stats.get("bytes_per_tier") or {}
        total += int(tiers.get("pinned") or 0) + int(tiers.get("ram") or 0)
    return total


def _record_disk_speeds() -> None:
    """Keeps the read speed each live disk layout measured in its folder (disk_speed.py): the
    next plan uses it instead of an assumed one. A layout read from its own checkpoint wrote
    no folder, and its speed is that file's disk's: nothing is kept for it."""
    for o in read_offloads():
        folder, gbps = o.stats.get("disk_folder"), o.stats.get("disk_gbps")
        if folder and gbps:
            disk_speed.record(os.path.dirname(os.path.normpath(folder)), float(gbps))


def host_machine(disk_folder: str | None, budgets: tuple[int | None, int | None]) -> MachineFacts:
    """This machine as core counts it; ``budgets``: the user's (VRAM, RAM) caps."""
    _record_disk_speeds()
    device = mm.get_torch_device()
    vram = None if device.type == "cpu" else int(mm.get_free_memory(device))
    on_gpu = vram is not None
    machine = read_machine(
        vram_free=vram,
        disk_folder=disk_folder,
        pin_limit=_pin_limit() if on_gpu else None,
        vram_budget=budgets[0],
        ram_budget=budgets[1],
        probe=True,  # a prompt's folder: its speed measured the first time it is planned
    )
    return replace(machine, ram_available=machine.ram_available + _live_host_ram())


_last: dict[str, Any] = {"key": None, "plan": None}


def plan_prompt(
    prompt: dict[str, Any],
    *,
    default_folder: str,
    budgets: tuple[int | None, int | None] = (None, None),
    panel_wish: Wish | None = None,
    held: Callable[[], dict[str, int]] | None = None,
) -> PromptPlan:
    """Plans every network ``prompt`` loads (headers only), each Ferry node's widgets parsed
    once. ``panel_wish``: the panel's saved settings, for a node with use_panel_settings on.
    ``held``: given by a node of the running prompt, which gets the plan made once for the
    prompt (the machine changes as its first network is laid out); asked only when planning:
    Ferry node id -> the bytes its network holds in RAM (a core loader read it whole), which
    the layout moves and the process's RAM already counts. None: planned afresh (the route)."""
    kw = (default_folder, budgets, panel_wish)
    key = None if held is None else json.dumps(prompt, sort_keys=True, default=str) + repr(kw)
    if key is not None and _last["key"] == key:
        return _last["plan"]  # type: ignore[no-any-return]
    ferry = {k: n.get("inputs", {}) for k, n in prompt.items() if _ferry_node(n)}
    settings: dict[str, NodeSettings] = {}
    for k, inputs in ferry.items():
        if not (inputs.get("use_panel_settings") and panel_wish is not None):
            try:
                settings[k] = NodeSettings.parse(inputs)
            except NodeInputError as e:  # the route's answer names the node
                raise NodeInputError(e.input_name, f"{e.message} (node {k})") from None
    wishes = {k: settings[k].wish if k in settings else panel_wish for k in ferry}
    mine = held() if held is not None else {}
    networks = [
        replace(n, facts=replace(n.facts, wish=wishes.get(n.ferry_id or "") or Wish(),
                                 held_bytes=mine.get(n.ferry_id or "", 0)))
        for n in prompt_networks(prompt, find_model_file, _cast, _keeps(), _loader_cost)
    ]  # fmt: skip
    # The disk folder of the prompt's first Ferry node that names one, else the default.
    folder = next((f for s in settings.values() if (f := s.disk_folder(""))), default_folder)
    machine = host_machine(folder, budgets)
    process = max(0, process_memory().rss - sum(n.facts.held_bytes for n in networks))
    plan = plan_graph(
        machine, [n.facts for n in networks], process_ram=process, steps=sampler_steps(prompt)
    )
    choices = {n.ferry_id: c for n, c in zip(networks, plan.choices) if n.ferry_id is not None}
    notes = tuple(loader_note(prompt, n) for n in networks)
    planned = PromptPlan(tuple(networks), plan, settings, choices, _swaps(prompt, networks), notes)
    if key is not None:
        _last["key"], _last["plan"] = key, planned
        for n, c in zip(networks, plan.choices):
            log.info(
                "ferry plan: %s (%s): %s", c.network.title, n.ferry_id or "no Ferry node", c.reason
            )
    return planned


def _ferry_node(node: Any) -> bool:
    return isinstance(node, dict) and node.get("class_type") in FERRY_NODES
