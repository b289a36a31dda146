"""Which core loader of a prompt the sidebar's plan offers to swap for Ferry's equivalent
("Use Ferry's loader", web/comfyui/ferry_swap.js), and how: the Ferry node, which of its
widgets takes which core widget's value, the values it sets itself, and why the swap is
offered or not.

The mapping is explicit (``SWAPS``), never guessed from names: the frontend applies it as
given. A core value Ferry's node does not accept (UNETLoader's fp8_e4m3fn_fast: Ferry has no
fp8 matmul path) means no button, and the plan says why. Pure (no ComfyUI import): what the
running server registers comes in as a function, so CI checks the table against Ferry's own
node schemas (tests/test_loader_swap.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Swap:
    """Core's loader ``core`` -> Ferry's node ``ferry``: ``widgets`` maps each Ferry widget to
    the core widget whose value (or link) it takes; ``fixed`` holds Ferry widgets set to a value
    that loads as core's node does; ``outputs`` the core output index behind each Ferry output."""

    core: str
    ferry: str
    widgets: Mapping[str, str]
    fixed: Mapping[str, Any] = field(default_factory=dict)
    outputs: tuple[int, ...] = (0,)


#: The core loaders users keep, and Ferry's equivalents (issue 48).
SWAPS: Mapping[str, Swap] = {
    s.core: s
    for s in (
        Swap(
            "UNETLoader",
            "FerryLoadDiffusionModelQuantized",
            {"unet_name": "unet_name", "weight_dtype": "weight_dtype"},
            fixed={"quant_preset": "none"},  # the weights as saved, as UNETLoader loads them
        ),
        Swap(
            "CLIPLoader",
            "FerryLoadTextEncoder",
            {"clip_name": "clip_name", "type": "type", "device": "device"},
        ),
        Swap(
            "DualCLIPLoader",
            "FerryLoadTextEncoderDual",
            {
                "clip_name1": "clip_name1",
                "clip_name2": "clip_name2",
                "type": "type",
                "device": "device",
            },
        ),
        Swap(
            "CheckpointLoaderSimple",
            "FerryLoadCheckpoint",
            {"ckpt_name": "ckpt_name"},
            outputs=(0, 1, 2),  # MODEL, CLIP, VAE
        ),
    )
}

#: ``accepts(ferry class)`` -> that node's widgets as the running server registers it: widget
#: name -> its list of choices (None: any value of its type); None where it is not registered.
Accepts = Callable[[str], "Mapping[str, list[Any] | None] | None"]

OFFERED = (
    "{core} holds the whole network in RAM before {ferry_node} runs; {title} leaves the "
    "weights in the file until {ferry_node} lays them out"
)
MAPPED = (
    "{core} leaves the weights in the file's mapping on this ComfyUI (no copy in RAM), so "
    "{title} would not lower the peak"
)


#: Ferry's loaders as the canvas titles them (their display names), for the plan's sentences.
TITLES: Mapping[str, str] = {
    "FerryLoadDiffusionModelQuantized": "Ferry Load Diffusion Model (quantized)",
    "FerryLoadTextEncoder": "Ferry Load Text Encoder",
    "FerryLoadTextEncoderDual": "Ferry Load Text Encoders (dual)",
    "FerryLoadCheckpoint": "Ferry Load Checkpoint",
}


def _title(ferry: str) -> str:
    return TITLES.get(ferry, ferry)


def _refusal(swap: Swap, inputs: Mapping[str, Any], accepts: Accepts) -> str | None:
    """Why ``swap`` cannot keep this node's values (None: it can)."""
    widgets = accepts(swap.ferry)
    if widgets is None:
        return f"this ComfyUI has no {swap.ferry} node (update ComfyUI-Ferry)"
    for ferry_w, core_w in swap.widgets.items():
        value = inputs.get(core_w)
        if core_w not in inputs or isinstance(value, list):  # absent (optional), or a link
            continue
        if ferry_w not in widgets:
            return f"{swap.ferry} has no {ferry_w} for {swap.core}'s {core_w}"
        choices = widgets[ferry_w]
        if choices is not None and value not in choices:
            return f"{swap.core}'s {core_w} {value!r} has no equivalent in {_title(swap.ferry)}"
    for ferry_w, value in swap.fixed.items():
        choices = widgets.get(ferry_w)
        if ferry_w not in widgets or (choices is not None and value not in choices):
            return f"{swap.ferry} has no {ferry_w} {value!r}"
    return None


def ferry_loader(
    node_id: str,
    node: Mapping[str, Any],
    ferry_nodes: list[str],
    accepts: Accepts,
    core_holds: bool = True,
) -> dict[str, Any] | None:
    """The plan's ``ferry_loader`` entry for the loader node ``node_id`` (API format):
    ``{"node_id", "class_type", "ferry_class", "widgets", "fixed", "outputs", "why"}``, with
    ``ferry_class`` None and ``why`` saying why where no swap is offered; None where the node
    is not a core loader Ferry has an equivalent for. ``ferry_nodes``: the titles of the Ferry
    offload nodes its networks go to (the swap lowers the peak only before one of them).
    ``core_holds``: whether core's loader holds the network in RAM (it copies the file, or
    converts the weights); where it leaves them in the file's mapping, the swap gains nothing."""
    swap = SWAPS.get(str(node.get("class_type")))
    if swap is None:
        return None
    inputs = node.get("inputs", {})
    why = _refusal(swap, inputs if isinstance(inputs, Mapping) else {}, accepts)
    if why is None and not ferry_nodes:
        why = (
            f"no Ferry offload node takes its output: after {_title(swap.ferry)} alone the "
            f"file is read whole too (add a Ferry offload node after {swap.core})"
        )
    if why is None and not core_holds:
        why = MAPPED.format(core=swap.core, title=_title(swap.ferry))
    entry: dict[str, Any] = {"node_id": node_id, "class_type": swap.core, "ferry_class": None}
    if why is None:
        why = OFFERED.format(
            core=swap.core, title=_title(swap.ferry), ferry_node=" and ".join(ferry_nodes)
        )
        entry.update(
            ferry_class=swap.ferry,
            widgets=dict(swap.widgets),
            fixed=dict(swap.fixed),
            outputs=list(swap.outputs),
        )
    entry["why"] = why
    return entry


def registered_widgets(input_types: Mapping[str, Any]) -> dict[str, list[Any] | None]:
    """A node's ``INPUT_TYPES()`` (required and optional) as ``Accepts`` gives it: a combo's
    choices, in either form core writes them (``(choices, opts)`` or ``("COMBO", {"options":
    choices})``); None for any other widget."""
    out: dict[str, list[Any] | None] = {}
    for section in ("required", "optional"):
        for name, spec in (input_types.get(section) or {}).items():
            kind = spec[0] if isinstance(spec, (list, tuple)) and spec else spec
            opts = spec[1] if isinstance(spec, (list, tuple)) and len(spec) > 1 else {}
            if isinstance(kind, (list, tuple)):
                out[name] = list(kind)
            elif isinstance(opts, dict) and isinstance(opts.get("options"), (list, tuple)):
                out[name] = list(opts["options"])
            else:
                out[name] = None
    return out
