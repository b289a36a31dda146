"""The widgets of "Ferry Offload Model", declared apart so the node file stays thin.

The ids are stable forever: saved workflows refer to them. New inputs go last and optional,
with the same defaults as ``execute()``'s keyword arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

from comfy_api.latest import io

from ..offload_core.control_defaults import control_defaults
from ..offload_core.policy import BAKE_MODES, CPU_READS, VERIFY_MODES
from .planning.config import LEVELS, TIER_CHOICES

#: Every widget's default: the policy's (offload_core/control_defaults.py), with the
#: planner's settings on "auto" (this host plans every network of the prompt).
DEFAULTS = control_defaults(planned=True)


def setting_inputs(bakes: bool = True) -> list[io.Input]:
    """Every setting of a Ferry offload node, after its one input: the panel's switch, then
    how, memory and the advanced ones; ``bake_lora`` only where the network bakes (its site's
    ``bakes``)."""
    panel = io.Boolean.Input(
        "use_panel_settings",
        default=False,
        tooltip="On: use the settings saved in the Ferry panel (the sidebar's "
        "'Open panel' button) and ignore the widgets below.",
    )
    return [panel, *how_inputs(), *memory_inputs(), *advanced_inputs(bakes)]


def how_inputs() -> list[io.Input]:
    """How the model is cut and where the rest of it waits."""
    return [
        io.Combo.Input(
            "level",
            options=list(LEVELS),
            default=DEFAULTS["level"],
            tooltip="block: move whole transformer blocks (fast, the usual choice). "
            "leaf: move layer by layer (least VRAM, more transfers).",
        ),
        # A text box, not a number box, so it can hold "auto" (ComfyUI hands a workflow's
        # saved number to a text input as its text: "2"; the one parser takes both).
        io.String.Input(
            "blocks_per_group",
            default=DEFAULTS["blocks_per_group"],
            tooltip="Blocks moved together (block level): 'auto' lets Ferry size groups so "
            "each copy is worth its launch; or a whole number (more = fewer, larger copies "
            "and more VRAM; at most the model's block count).",
        ),
        io.Combo.Input(
            "tier",
            options=list(TIER_CHOICES),
            default=DEFAULTS["tier"],
            tooltip="Where offloaded weights wait: auto = Ferry chooses for this machine and "
            "every network of the prompt together (the sidebar says why); pinned = page-locked "
            "RAM (fastest copies); ram = ordinary RAM; shared = RAM shared by every ComfyUI on this "
            "machine (one copy for all: one server per GPU); disk = files in disk_path (saves RAM).",
        ),
        io.String.Input(
            "disk_path",
            default=DEFAULTS["disk_path"],
            tooltip="Folder for the disk tier, ideally on an SSD/NVMe. Empty: ComfyUI's "
            "temp folder. Ferry writes only its own ferry-* folder there.",
        ),
    ]


def memory_inputs() -> list[io.Input]:
    """How much the GPU holds: look-ahead and the VRAM budget."""
    return [
        io.String.Input(
            "prefetch_depth",
            default=DEFAULTS["prefetch_depth"],
            tooltip="Groups loaded ahead of the one computing: 'auto' goes as deep as hides "
            "the tier's speed; or 1..8 (each extra one costs one group of VRAM).",
        ),
        io.String.Input(
            "vram_budget",
            default=DEFAULTS["vram_budget"],
            tooltip="VRAM Ferry may use for weights: 'auto' keeps as many groups "
            "resident as fit; a number of GiB (e.g. 6); empty (or 0) streams every group "
            "(least VRAM).",
        ),
    ]


def advanced_inputs(bakes: bool = True) -> list[io.Input]:
    """Rarer options, optional and last, so workflows saved before them still load: a missing
    optional input takes its default (the same default execute() has). ``bake_lora`` is the
    last one, so a node without it loads a workflow that saved its value: the frontend sets
    widgets by position and drops the extra value; the server drops an input not declared."""
    inputs: list[io.Input] = [
        io.Float.Input(
            "headroom_gb", default=DEFAULTS["headroom_gb"], min=0.0, max=1024.0, step=0.25,
            optional=True, tooltip="With vram_budget 'auto': VRAM left free for activations "
            "and the VAE, in GiB (the name's 'gb', as every memory amount in Ferry).",
        ),
        io.Boolean.Input(
            "direct_io", default=DEFAULTS["direct_io"], optional=True,
            tooltip="Disk tier: read with O_DIRECT (no page-cache copy). Off: buffered reads, "
            "faster only when the group files fit in RAM anyway.",
        ),
        io.Combo.Input(
            "verify", options=list(VERIFY_MODES), default=DEFAULTS["verify"], optional=True,
            tooltip="Disk tier: check the files' checksums on each group's first read, or on "
            "every read (catches a disk that corrupts data later, costs CPU).",
        ),
        io.Combo.Input(
            "cpu_read", options=list(CPU_READS), default=DEFAULTS["cpu_read"], optional=True,
            tooltip="Disk tier on a CPU: auto copies each group into a buffer (faster) unless "
            "the buffers would take over a quarter of the free RAM, then maps; mapped computes "
            "straight from the page cache (least RAM); copy always copies. A GPU always copies.",
        ),
    ]  # fmt: skip
    if not bakes:
        return inputs
    return [
        *inputs,
        io.Combo.Input(
            "bake_lora", options=list(BAKE_MODES), default=DEFAULTS["bake_lora"], optional=True,
            tooltip="LoRA on GGUF weights: on computes each patched weight once when Ferry lays "
            "the model out (the same result, no LoRA cost per step, but the weight moves "
            "dequantized: 2-4x the bytes); auto measures both once and chooses; off applies the "
            "patches on every forward, as ComfyUI-GGUF does.",
        ),
    ]  # fmt: skip


@dataclass(frozen=True)
class NodeText:
    """What a Ferry offload node shows: its id (stable forever: saved workflows refer to it),
    name and description, the ComfyUI type of the network it takes and gives, what it calls
    that network in its tooltips, and its input's tooltip where that says more."""

    node_id: str
    display_name: str
    description: str
    network: type[io.ComfyTypeIO]
    what: str
    tooltip: str = ""


def offload_schema(text: NodeText, name: str, bakes: bool = True) -> io.Schema:
    """The schema of a Ferry offload node: its network's input (``name``), then every setting
    of Ferry Offload Model (``bake_lora`` where ``bakes``), and the same network out."""
    tooltip = text.tooltip or f"The {text.what} to offload."
    return io.Schema(
        node_id=text.node_id,
        display_name=text.display_name,
        category="Ferry",
        description=text.description,
        inputs=[text.network.Input(name, tooltip=tooltip), *setting_inputs(bakes)],
        outputs=[text.network.Output(tooltip=f"The same {text.what}; it loads through Ferry.")],
        # The queued prompt and this node's id: "auto" is planned for all its networks.
        hidden=[io.Hidden.prompt, io.Hidden.unique_id],
    )
