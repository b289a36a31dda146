"""Quantizing group by group while a layout streams the checkpoint: models bigger than RAM.

``load_quantized`` fills a whole model, so the quantized model is whole in RAM. A streamed
layout (``load_offloaded(quantize=...)``) instead quantizes the chosen Linears on the meta
device first: torchao builds the same wrapper around meta inner tensors (the same names,
shapes, dtypes and ctx that quantizing real weights gives), so the offload plan lays out
quantized groups before any weight is read. Each weight is then quantized for real as its
group is filled from the checkpoint (``QuantizedStream.convert``), one tensor at a time, into
that group's slab; on the disk tier the slab goes to Ferry's group file, so no more than one
converted group is in RAM. The bytes are those ``load_quantized`` computes (same cast, same
``quantize_linear``); ``CheckpointWeights`` refuses a result whose layout differs from the
plan's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from .presets import Preset, resolve_preset
from .quantize import quantize_choice, quantize_weight
from .report import QuantReport
from .selection import SkipRules, choose_layers

#: ``convert(qualname, tensor)`` as ``CheckpointWeights`` takes it.
Converter = Callable[[str, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class QuantizedStream:
    """Which weights a streamed layout quantizes, and how (``convert``)."""

    report: QuantReport  # per layer: quantized or why kept, bytes before and after
    names: frozenset[str]  # the quantized weights' qualnames ("blocks.0.attn.qkv.weight")
    config: Any  # the torchao config
    device: torch.device  # where each weight is quantized before it goes to its slab

    def changes(self, name: str) -> bool:
        return name in self.names

    def convert(self, name: str, weight: torch.Tensor) -> torch.Tensor:
        """The weight ``name`` quantized (it arrives cast to the model's dtype)."""
        return quantize_weight(weight.to(self.device), self.config)

    def after(
        self, first: Converter | None, first_changes: Callable[[str], bool] | None
    ) -> tuple[Converter, Callable[[str], bool]]:
        """``first`` (a baked patch: a LoRA), then quantization, as one converter."""

        def changes(name: str) -> bool:
            return self.changes(name) or (first_changes is not None and first_changes(name))

        def convert(name: str, t: torch.Tensor) -> torch.Tensor:
            if first is not None and first_changes is not None and first_changes(name):
                t = first(name, t)
            return self.convert(name, t) if self.changes(name) else t

        return convert, changes


def plan_quantized(
    model: nn.Module,
    preset: str | Preset,
    *,
    skip: SkipRules | Sequence[str] | str | None = None,
    device: torch.device | str = "cpu",
) -> QuantizedStream:
    """Quantizes the chosen Linears of a meta-built ``model`` in shape only (no bytes) and
    returns how to quantize their weights as they stream. Settings are checked first: a bad
    one raises ConfigError naming it, before any weight is read."""
    dev = torch.device(device)
    p = resolve_preset(preset, dev)
    if not p.quantizes:
        raise ConfigError("quant_preset", "'none' quantizes nothing; pass quantize=None")
    rules = SkipRules.from_user(skip)
    config = p.make_config()
    report = QuantReport(preset=p.name, device=str(dev))
    names: set[str] = set()
    for c in choose_layers(model, p, rules):
        if c.quantize and c.module.weight.device.type != "meta":  # type: ignore[union-attr]
            raise ConfigError("build", f"{c.name} is not on the meta device")
        layer = quantize_choice(c, config, None)
        report.layers.append(layer)
        if layer.quantized:
            names.add(f"{c.name}.weight" if c.name else "weight")
    return QuantizedStream(report, frozenset(names), config, dev)
