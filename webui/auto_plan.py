"""The accordion's ``auto``: one plan of the loaded checkpoint's networks by offload_core's
planner (``plan_graph``, the one ComfyUI's "auto" widgets use), shared by the generation
(webui/script.py), the Plan button and ``GET /ferry/plan`` (webui/plan.py), so all three
give the same tier, blocks per group and look-ahead.

Nothing loads and nothing moves: each network's figures are read from the module where it is
(``network_from_module`` walks its tensors' sizes and devices; Forge's networks are plain
modules between generations), the machine's now (``read_machine``, with the accordion's disk
folder). The UNet is read ``unet_reads(steps, cfg_scale)`` times a generation: the Steps
slider, twice a step where CFG runs the negative prompt too (any scale but 1).

A plan is kept for its settings and checkpoint (``plan_for``): once auto has chosen, a
generation with the same controls, steps and CFG on the same checkpoint gets the same choice,
so it reuses the layout instead of laying the UNet out again because free RAM moved a little
(or because laying out the text encoder moved its weights between its encode and the
sampling); another checkpoint or any changed control plans anew.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ..offload_core import ConfigError
from ..offload_core.formats.safetensors import read_checkpoint_header
from ..offload_core.model.layout import module_nbytes
from ..offload_core.offload_kind import OffloadKind
from ..offload_core.planner import GraphPlan, MachineFacts, NetworkFacts, plan_graph
from ..offload_core.planner.machine import read_machine
from ..offload_core.planner.network_module import network_from_module
from ..offload_core.policy import AUTO
from ..offload_core.runtime.memory import process_memory
from ..offload_core.tools.machine_plan import free_vram
from .controls import Asked

#: Forge's Steps and CFG Scale sliders' defaults (an API call that gives neither runs these).
DEFAULT_STEPS = 20
DEFAULT_CFG = 7.0
#: Plans kept (settings x checkpoint): the accordions of txt2img and img2img, a few changes.
KEPT = 8
_PLANS: OrderedDict[tuple[Any, ...], GraphPlan] = OrderedDict()


def sampling(steps: Any, cfg_scale: Any) -> tuple[int, float]:
    """The Steps and CFG Scale a generation runs (values that are no numbers: Forge's
    defaults, as an API call that gives none runs)."""
    try:
        return max(1, int(steps)), float(cfg_scale)
    except (TypeError, ValueError):
        return DEFAULT_STEPS, DEFAULT_CFG


def unet_reads(steps: Any, cfg_scale: Any) -> float:
    """How often a generation reads the whole UNet: once per sampling step and pass; CFG 1
    runs the positive prompt alone (Forge skips the negative pass), any other scale both."""
    n, cfg = sampling(steps, cfg_scale)
    return float(n * (1 if cfg == 1.0 else 2))


def title_of(kind: OffloadKind) -> str:
    """A plan line's title in Forge's words: its UNet, else the kind's label ("Text encoder")."""
    return "UNet" if kind is OffloadKind.MODEL else kind.label[:1].upper() + kind.label[1:]


def loaded_networks(
    sd_model: Any, text_encoder: bool
) -> list[tuple[OffloadKind, nn.Module]] | None:
    """(kind, module) of the networks the accordion offloads in ``sd_model``: the UNet,
    then the text encoder where ``text_encoder``; None where no checkpoint is loaded (None,
    or Forge's stand-in model before the first load, which has no ``forge_objects``)."""
    objects = getattr(sd_model, "forge_objects", None)
    unet = getattr(getattr(objects, "unet", None), "model", None)
    diffusion = getattr(unet, "diffusion_model", None)
    if diffusion is None:
        return None
    out: list[tuple[OffloadKind, nn.Module]] = [(OffloadKind.MODEL, diffusion)]
    clip = getattr(objects, "clip", None)
    if text_encoder and clip is not None:
        out.append((OffloadKind.TEXT_ENCODER, clip.cond_stage_model))
    return out


def _in_place(module: nn.Module, filename: str | None) -> bool:
    """Whether the disk tier would read the UNet from its checkpoint, writing nothing (Forge
    hands it the file: webui/script.py): a safetensors file whose UNet tensors hold as many
    bytes as Forge runs (loaded as stored, not cast). Reads the header only; a file that
    cannot be read counts as written."""
    if not filename or not filename.endswith(".safetensors"):
        return False
    try:
        entries = read_checkpoint_header(filename).entries
    except (ConfigError, OSError):
        return False
    want = module_nbytes(module)
    # Checkpoints keep the UNet under "model.diffusion_model."; a UNet-only file has no prefix.
    return any(
        sum(t.nbytes for k, t in entries.items() if k.startswith(prefix)) == want
        for prefix in ("model.diffusion_model.", "")
    )


def network_facts(
    sd_model: Any, nets: list[tuple[OffloadKind, nn.Module]], reads: float
) -> list[NetworkFacts]:
    info = getattr(sd_model, "sd_checkpoint_info", None)
    out = []
    for kind, module in nets:
        if kind is OffloadKind.MODEL:
            name = getattr(info, "model_name", None) or "unet"
            facts = network_from_module(module, name, kind, reads_per_prompt=reads)
            facts = replace(facts, in_place=_in_place(module, getattr(info, "filename", None)))
        else:  # named by its encoders, as its offload's line is (webui/script.py)
            name = " + ".join(n for n, _ in module.named_children()) or kind.noun
            # Counted as written: Forge renames and copies its tensors (README, its RAM).
            facts = network_from_module(module, name, kind)
        out.append(facts)
    return out


def machine_for(
    sd_model: Any, nets: list[tuple[OffloadKind, nn.Module]], asked: Asked
) -> MachineFacts:
    """This machine now, as the accordion's settings would meet it: the UNet's load device's
    free VRAM (its own bytes and the text encoder's already there count as free: loading
    through Ferry moves them), the VRAM budget and its headroom, the disk folder."""
    device = torch.device(sd_model.forge_objects.unet.load_device)
    vram = None
    if device.type != "cpu":
        vram = (free_vram(str(device)) or 0) + sum(module_nbytes(m, device) for _, m in nets)
    budget = asked.vram_budget
    machine = read_machine(
        vram_free=vram,
        disk_folder=asked.disk_path or None,
        # "auto" (None here) keeps what fits in free VRAM; empty (0) streams every group.
        vram_budget=None if budget == AUTO else (budget or 0),
        probe=True,  # the accordion's folder: its speed measured the first time it is planned
    )
    return replace(machine, vram_headroom=asked.headroom_bytes)


def plan_for(
    sd_model: Any, nets: list[tuple[OffloadKind, nn.Module]], asked: Asked, reads: float
) -> GraphPlan:
    """The plan of ``nets`` (``loaded_networks``) with the accordion's ``asked`` settings
    (``asked.wish``: what the user fixed; the rest the planner chooses), ``plan.choices`` in
    ``nets`` order; kept for these settings on this checkpoint (the module docstring). Never
    raises for a plan that does not fit: ``plan.refusal`` says why."""
    info = getattr(sd_model, "sd_checkpoint_info", None)
    key = (asked, reads, getattr(info, "filename", None), *((t, id(m)) for t, m in nets))
    plan = _PLANS.get(key)
    if plan is None:
        facts = network_facts(sd_model, nets, reads)
        machine = machine_for(sd_model, nets, asked)
        process = max(0, process_memory().rss - sum(f.held_bytes for f in facts))
        plan = plan_graph(
            machine, [replace(f, wish=asked.wish) for f in facts], process_ram=process
        )
        _PLANS[key] = plan
        while len(_PLANS) > KEPT:
            _PLANS.popitem(last=False)
    _PLANS.move_to_end(key)
    return plan


def forget() -> None:
    """Drops the kept plans (tests; a checkpoint change needs none: its modules differ)."""
    _PLANS.clear()
