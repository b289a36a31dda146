"""Quantizing a model already in memory, in place, layer by layer."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from ..runtime.memory import trim_heap
from .model_tensors import module_tensors, place
from .presets import Preset, resolve_preset
from .report import LayerReport, QuantReport
from .selection import (
    DECLINED,
    LayerChoice,
    SkipRules,
    choose_layers,
    is_quantized,
    module_bytes,
)

# Rows quantized at a time. torchao's temporaries are 4-8x its input (measured: 288 MB for a
# 72 MB bf16 3072x12288 layer with int8, 540 MB with float8); in slices they stay small, so
# the loader's RAM bound holds for the largest layers of real models.
CHUNK_BYTES = 16 << 20
# Subclasses whose inner tensors are all laid out row by row (dim 0 = the weight's rows) when
# block_size[0] == 1: quantizing row slices and stacking them gives exactly the whole result
# (tests/test_quant_selection.py checks this bit for bit).
ROW_SEPARABLE = ("Int8Tensor", "Float8Tensor", "IntxUnpackedToInt8Tensor")


def quantize_linear(module: nn.Linear, config: Any, chunk_bytes: int = CHUNK_BYTES) -> None:
    """Quantizes one Linear's weight in place with a torchao config (where it already is)."""
    from torchao.quantization import quantize_

    weight = module.weight
    rows = max(2, chunk_bytes // max(1, weight.shape[1] * weight.element_size()))
    if weight.dim() == 2 and weight.shape[0] > rows:
        q = _quantize_rows(weight.detach(), config, rows)
        if q is not None:
            module.weight = nn.Parameter(q, requires_grad=False)
            return
    quantize_(module, config)


def _quantized_bare(
    weight: torch.Tensor, config: Any, quantize: Callable[[nn.Linear, Any], None]
) -> torch.Tensor:
    """``weight`` quantized by ``quantize`` in a bias-free Linear built around it (no copy)."""
    with torch.device("meta"):
        holder = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    holder.weight = nn.Parameter(weight, requires_grad=False)
    quantize(holder, config)
    # torchao sets holder.extra_repr to a method bound to holder: a reference cycle that would
    # keep the quantized copy alive until the cyclic GC runs. Break it.
    holder.__dict__.pop("extra_repr", None)
    return holder.weight


def _quantize_slice(rows: torch.Tensor, config: Any) -> torch.Tensor:
    from torchao.quantization import quantize_

    return _quantized_bare(rows, config, quantize_)


def _quantize_rows(weight: torch.Tensor, config: Any, rows: int) -> torch.Tensor | None:
    """The weight quantized ``rows`` rows at a time, or None where the scheme is not row by
    row (per-tensor scales, transposed scale layouts): the caller quantizes it whole."""
    n = weight.shape[0]
    first = _quantize_slice(weight[:rows], config)
    block = getattr(first, "block_size", None)
    if type(first).__name__ not in ROW_SEPARABLE or block is None or block[0] != 1:
        return None
    names, ctx = first.__tensor_flatten__()  # type: ignore[attr-defined]
    parts = {k: getattr(first, k) for k in names}
    if any(t.dim() == 0 or t.shape[0] != rows for t in parts.values()):
        return None
    cls = type(first)
    full = {k: t.new_empty((n, *t.shape[1:])) for k, t in parts.items()}
    for k, t in parts.items():
        full[k][:rows].copy_(t)
    del first, parts
    for start in range(rows, n, rows):
        piece = _quantize_slice(weight[start : start + rows], config)
        piece_names, piece_ctx = piece.__tensor_flatten__()  # type: ignore[attr-defined]
        if piece_names != names or piece_ctx != ctx:
            return None
        for k in names:
            full[k][start : start + rows].copy_(getattr(piece, k))
        del piece
        trim_heap()
    return cls.__tensor_unflatten__(full, ctx, weight.shape, weight.stride())  # type: ignore[attr-defined,no-any-return]


def move_direct(module: nn.Module, device: torch.device) -> None:
    """Moves the tensors ``module`` owns directly (its children move on their own turn)."""
    for s in module_tensors("", module):
        t = s.get()
        if t.device != device:
            place(s, t.to(device), requires_grad=t.requires_grad)


def quantize_model(
    model: nn.Module,
    preset: str | Preset,
    *,
    skip: SkipRules | Sequence[str] | str | None = None,
    device: torch.device | str | None = None,
) -> QuantReport:
    """Quantizes ``model`` in place and reports what was done to each layer.

    device: where to quantize and leave the model (None: where it is). Each layer moves there
    just before it is quantized, so quantizing on a GPU does not need the whole full-precision
    model on the GPU first.
    """
    start = time.perf_counter()
    tensors = [t for t in (*model.parameters(), *model.buffers())]
    if any(t.device.type == "meta" for t in tensors):
        raise ConfigError(
            "model",
            "has tensors on the meta device; use load_quantized to fill it from a checkpoint",
        )
    dev = (
        torch.device(device)
        if device is not None
        else (tensors[0].device if tensors else torch.device("cpu"))
    )
    p = resolve_preset(preset, dev)
    rules = SkipRules.from_user(skip)
    config = p.make_config() if p.quantizes else None
    report = QuantReport(preset=p.name, device=str(dev))
    for c in choose_layers(model, p, rules):
        report.layers.append(quantize_choice(c, config, dev if device is not None else None))
    report.seconds = time.perf_counter() - start
    return report


def quantize_choice(c: LayerChoice, config: Any, device: torch.device | None) -> LayerReport:
    """Quantizes one chosen layer in place (moved to ``device`` first, if given) and says
    what was done. On the meta device this quantizes shapes only: torchao builds the same
    wrapper with meta inner tensors, which is how a streamed layout plans quantized groups."""
    before = module_bytes(c.module)
    if device is not None:
        move_direct(c.module, device)
    quantized, reason = c.quantize, c.reason
    if c.quantize:
        assert isinstance(c.module, nn.Linear)
        quantize_linear(c.module, config)
        if not is_quantized(c.module.weight):
            quantized, reason = False, DECLINED
    kind = type(c.module).__name__
    return LayerReport(c.name, kind, quantized, reason, before, module_bytes(c.module))


def quantize_weight(weight: torch.Tensor, config: Any) -> torch.Tensor:
    """A Linear weight quantized where it is, exactly as ``quantize_linear`` quantizes it in
    its module (the bias takes no part), or the weight itself where torchao declines it."""
    return _quantized_bare(weight, config, quantize_linear)
