"""The planner in ComfyUI: a queued prompt's networks (prompt_networks.py) planned together
on this machine as core counts it, once per prompt, for every Ferry node of the prompt and
for the pre-flight route alike (``plan_prompt``).

Core's figures: free VRAM as ``comfy.model_management.get_free_memory`` counts it (what its
own models could free included), the pin limit ``MAX_PINNED_MEMORY`` (core pins nothing
where it is <= 0), the dtype core loads each kind in. The RAM that live Ferry layouts hold
counts as available: a prompt that plans them again replaces or keeps them.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import comfy.model_management as mm
import comfy.utils
import folder_paths
import torch

from ...offload_core.offload_kind import OffloadKind
from ...offload_core.planner import Choice, GraphPlan, MachineFacts, disk_speed, plan_graph
from ...offload_core.planner.facts import Kind, Wish
from ...offload_core.planner.machine import read_machine
from ...offload_core.runtime.memory import process_memory
from ...offload_core.tools.monitor import read_offloads
from ..input_error import NodeInputError
from .config import NodeSettings
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

    def as_dict(self) -> dict[str, Any]:
        body = self.plan.as_dict()
        for entry, n in zip(body["networks"], self.networks):
            entry.update(loader_node=n.loader_id, ferry_node=n.ferry_id, files=list(n.files))
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


def _find(folder: str, name: str) -> str | None:
    try:
        return folder_paths.get_full_path(folder, name)  # type: ignore[no-any-return]
    except KeyError:  # a folder name this core does not know (a pack's, not installed)
        return None


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
        for n in prompt_networks(prompt, _find, _cast, _keeps())
    ]  # fmt: skip
    # The disk folder of the prompt's first Ferry node that names one, else the default.
    folder = next((f for s in settings.values() if (f := s.disk_folder(""))), default_folder)
    machine = host_machine(folder, budgets)
    process = max(0, process_memory().rss - sum(n.facts.held_bytes for n in networks))
    plan = plan_graph(
        machine, [n.facts for n in networks], process_ram=process, steps=sampler_steps(prompt)
    )
    choices = {n.ferry_id: c for n, c in zip(networks, plan.choices) if n.ferry_id is not None}
    planned = PromptPlan(tuple(networks), plan, settings, choices)
    if key is not None:
        _last["key"], _last["plan"] = key, planned
        for n, c in zip(networks, plan.choices):
            log.info(
                "ferry plan: %s (%s): %s", c.network.title, n.ferry_id or "no Ferry node", c.reason
            )
    return planned


def _ferry_node(node: Any) -> bool:
    return isinstance(node, dict) and node.get("class_type") in FERRY_NODES
