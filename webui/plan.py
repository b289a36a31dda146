"""The "Ferry offload" accordion's **Plan** button: offload_core's planner (the one ComfyUI's
"auto" settings and pre-flight use) run on the checkpoint Forge has loaded, said in Markdown.

Nothing loads and nothing moves: each network's figures are read from the module where it is
(``network_from_module`` walks its tensors' sizes and devices; Forge's networks are plain
modules between generations), the machine's now (``read_machine``, with the accordion's disk
folder). The caller passes the loaded model (webui/entry.py: Forge's
``model_data.sd_model``, never ``shared.sd_model``, which loads one when none is), so CI
tests this on stand-ins.

Two plans are shown: what Ferry would choose for each network (every setting "auto"), each
choice with the planner's sentence; then whether the accordion's own settings fit, with the
planner's warning or refusal naming the control to change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ..offload_core import ConfigError, DiskTier, OffloadPolicy
from ..offload_core.formats.safetensors import read_checkpoint_header
from ..offload_core.model.layout import module_nbytes
from ..offload_core.offload_kind import OffloadKind
from ..offload_core.planner import GraphPlan, MachineFacts, NetworkFacts, Wish, plan_graph
from ..offload_core.planner.machine import read_machine
from ..offload_core.planner.network_module import network_from_module
from ..offload_core.policy import AUTO, parse_disk_path
from ..offload_core.runtime.memory import process_memory
from ..offload_core.tools.machine_plan import free_vram
from ..offload_core.units import fmt_bytes
from .controls import CONTROLS, LABELS, ControlError, as_control_error, controls_dict, describe
from .controls import offload_from_controls as offload_of

NO_CHECKPOINT = (
    "Ferry: no checkpoint is loaded, so there is nothing to plan. Choose one in the Checkpoint "
    "menu (or generate once), then press Plan again: Plan never loads a model itself."
)
TEXT_ENCODER_OFF = f"The text encoder is Forge's own: tick *{LABELS['text_encoder']}* to plan it."
#: How often a generation reads the UNet: Forge's default 20 steps, twice a step (a CFG
#: scale above 1 runs the negative prompt too). The planner weighs which network is
#: cheapest to read from disk by it; the text encoder is read once.
UNET_READS = 40.0


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


def title_of(kind: OffloadKind) -> str:
    """A plan line's title in Forge's words: its UNet, else the kind's label ("Text encoder")."""
    return "UNet" if kind is OffloadKind.MODEL else kind.label[:1].upper() + kind.label[1:]


def _facts(sd_model: Any, nets: list[tuple[OffloadKind, nn.Module]]) -> list[NetworkFacts]:
    info = getattr(sd_model, "sd_checkpoint_info", None)
    out = []
    for kind, module in nets:
        if kind is OffloadKind.MODEL:
            name = getattr(info, "model_name", None) or "unet"
            facts = network_from_module(module, name, kind, reads_per_prompt=UNET_READS)
            facts = replace(facts, in_place=_in_place(module, getattr(info, "filename", None)))
        else:  # named by its encoders, as its offload's line is (webui/script.py)
            name = " + ".join(n for n, _ in module.named_children()) or kind.noun
            # Counted as written: Forge renames and copies its tensors (README, its RAM).
            facts = network_from_module(module, name, kind)
        out.append(facts)
    return out


def _folder(c: dict[str, Any], policy: OffloadPolicy | None, default: str) -> str:
    """The disk folder the disk tier would use: the settings' own, else the Disk folder box
    (empty: the WebUI's default), else the default where the box holds no full path."""
    if policy is not None and isinstance(policy.tier, DiskTier):
        return policy.tier.path
    try:
        return parse_disk_path(c["disk_path"], default)
    except ConfigError:
        return default


def _machine(
    sd_model: Any,
    nets: list[tuple[OffloadKind, nn.Module]],
    policy: OffloadPolicy | None,
    folder: str,
) -> MachineFacts:
    """This machine now, as the accordion's settings would meet it: the UNet's load device's
    free VRAM (its own bytes and the text encoder's already there count as free: loading
    through Ferry moves them), the VRAM budget and its headroom."""
    device = torch.device(sd_model.forge_objects.unet.load_device)
    vram = None
    if device.type != "cpu":
        vram = (free_vram(str(device)) or 0) + sum(module_nbytes(m, device) for _, m in nets)
    budget = None if policy is None else policy.vram_budget
    machine = read_machine(
        vram_free=vram,
        disk_folder=folder,
        # "auto" (None here) keeps what fits in free VRAM; empty (0) streams every group.
        vram_budget=None if budget == AUTO else (budget or 0),
        probe=True,  # the Plan button's folder: its speed measured the first time
    )
    if policy is not None:
        machine = replace(machine, vram_headroom=policy.headroom_bytes)
    return machine


def settings_of(values: tuple[Any, ...] | list[Any], **kw: Any) -> tuple[Any, str | None]:
    """The accordion's settings as if it were on (the offload, or None and the error naming
    the control), so Plan checks them before the accordion is switched on."""
    try:
        c = controls_dict(values)
        on = [True, *(c[cid] for cid, _ in CONTROLS[1:])]
        return offload_of(on, **kw), None
    except ControlError as e:
        return None, str(e)


def _choice_lines(title: str, plan: GraphPlan, i: int) -> list[str]:
    c = plan.choices[i]
    n = c.network
    return [
        f"**{title}** ({n.name}, {fmt_bytes(n.nbytes)}): **{c.tier}**, "
        f"{c.blocks_per_group} block(s) per group, look-ahead {c.prefetch_depth}.  ",
        f"Why: {c.reason}.",
        "",
    ]


def _verdict(plan: GraphPlan, from_saved: bool) -> str:
    if plan.refusal is not None:  # named by the accordion's control, not the setting
        return f"does not fit: {as_control_error(plan.refusal, saved=from_saved)}"
    return plan.verdict()


def plan_text(
    sd_model: Any,
    values: tuple[Any, ...] | list[Any],
    *,
    default_disk_path: str,
    load_saved: Callable[[], Any],
) -> str:
    """The Plan button's Markdown for ``sd_model`` (Forge's loaded model, or None) and the
    accordion's ``values`` (in ``CONTROLS`` order). Never raises for a setting: it is said."""
    c = controls_dict(values) if len(values) <= len(CONTROLS) else {}
    nets = loaded_networks(sd_model, c.get("text_encoder") is True)
    if nets is None:
        return NO_CHECKPOINT
    offload, error = settings_of(values, default_disk_path=default_disk_path, load_saved=load_saved)
    policy = None if offload is None else offload.policy
    machine = _machine(sd_model, nets, policy, _folder(c, policy, default_disk_path))
    facts = _facts(sd_model, nets)
    process = max(0, process_memory().rss - sum(f.held_bytes for f in facts))
    auto = plan_graph(machine, facts, process_ram=process)
    lines = ["### What Ferry would choose (nothing was loaded or moved to plan it)", ""]
    for i, (kind, _) in enumerate(nets):
        lines += _choice_lines(title_of(kind), auto, i)
    if c.get("text_encoder") is not True:
        lines += [TEXT_ENCODER_OFF, ""]
    lines += [f"Predicted: {auto.verdict()}.", "", "### The accordion's settings", ""]
    if offload is None:
        return "\n".join([*lines, f"Not usable: {error}"])
    # Layer by layer has no blocks per group: the planner sizes its own groups then, and what
    # it checks (the tier's RAM, pins and disk room) is the same.
    level = getattr(offload.policy.level, "blocks_per_group", None)
    wish = Wish(offload.policy.tier_name, level, offload.policy.prefetch_depth)
    mine = plan_graph(machine, [replace(f, wish=wish) for f in facts], process_ram=process)
    on = "" if c.get("enabled") is True else " (the accordion is off: Forge loads it its own way)"
    lines.append(f"{describe(offload.policy)}{on}: {_verdict(mine, offload.from_saved)}.")
    return "\n".join(lines)
