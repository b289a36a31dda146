"""The cold load: read, quantize and place one layer at a time from a safetensors checkpoint
(read through its ``CheckpointIndex``, sources/checkpoint.py).

Memory: a weight that will be quantized is read into one reused staging buffer (sized for the
largest such weight); torchao writes its quantized copy into new tensors and the staging
buffer is overwritten by the next layer. Every tensor kept as it is gets its own allocation
(allocator-aligned: kernels choose their vectorised paths from the data pointer's alignment,
so a weight used in place at an arbitrary file offset computes different low bits). So RAM holds the quantized model so far plus about one full-precision layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..formats.safetensors import StoredTensor, byte_view
from ..model.layout import tensor_nbytes
from ..runtime.memory import trim_heap
from ..sources.checkpoint import CheckpointIndex
from .model_tensors import module_tensors, place, state_names
from .presets import Preset
from .quantize import move_direct, quantize_linear
from .report import LayerReport
from .selection import DECLINED, LayerChoice, is_quantized, module_bytes

Progress = Callable[[int, int], object]


def _entry(
    index: CheckpointIndex, keys: dict[str, str], names: Any, meta: torch.Tensor
) -> StoredTensor:
    """The checkpoint entry of a meta tensor (``keys``: ``CheckpointIndex.match``'s, by each
    of a tied tensor's names)."""
    return index.entries[keys[names[id(meta)][0]]]


def _weight(c: LayerChoice) -> torch.Tensor:
    assert isinstance(c.module, nn.Linear)
    return c.module.weight


def _aliases(t: torch.Tensor, buffer: torch.Tensor) -> bool:
    inner = [getattr(t, n) for n in t.__tensor_flatten__()[0]] if is_quantized(t) else [t]  # type: ignore[attr-defined]
    ptr = buffer.untyped_storage().data_ptr()
    return any(x.device == buffer.device and x.untyped_storage().data_ptr() == ptr for x in inner)


@dataclass
class _Stream:
    """What every layer of one stream_quantize call shares."""

    index: CheckpointIndex  # open for reads
    keys: dict[str, str]  # model name -> checkpoint key (CheckpointIndex.match)
    names: Any  # state_names(model)
    staging: torch.Tensor | None  # one reused buffer for the weights to quantize
    device: torch.device
    qdev: torch.device
    config: Any
    placed: dict[int, torch.Tensor] = field(default_factory=dict)  # meta id -> real (tied)
    keep_alive: list[torch.Tensor] = field(default_factory=list)  # so a meta id is not reused


def stream_quantize(
    model: nn.Module,
    index: CheckpointIndex,
    keys: dict[str, str],
    choices: list[LayerChoice],
    preset: Preset,
    device: torch.device,
    progress: Progress | None = None,
    quantize_device: torch.device | None = None,
) -> list[LayerReport]:
    """Fills the meta model from the checkpoint, quantizing the chosen Linears on the way.

    A chosen Linear is quantized on ``quantize_device`` (default ``device``) and then moved to
    ``device``: a GPU-only preset can quantize on the GPU for a model that lives in RAM."""
    config = preset.make_config() if preset.quantizes else None
    # The checkpoint's bytes (its dtype may be wider than the model's) of every weight to quantize.
    names = state_names(model)
    staged = [_entry(index, keys, names, _weight(c)).nbytes for c in choices if c.quantize]
    staging = torch.empty(max(staged), dtype=torch.uint8) if staged else None
    layers: list[LayerReport] = []
    with index:
        st = _Stream(index, keys, names, staging, device, quantize_device or device, config)
        for i, c in enumerate(choices):
            before, weight_id = _fill_layer(st, c)
            quantized, reason = c.quantize, c.reason
            if quantized:
                quantized, reason = _quantize_layer(st, c, weight_id)
            kind = type(c.module).__name__
            layers.append(
                LayerReport(c.name, kind, quantized, reason, before, module_bytes(c.module))
            )
            if progress is not None:
                progress(i + 1, len(choices))
        st.staging = None
    del staging
    trim_heap()
    return layers


def _fill_layer(st: _Stream, c: LayerChoice) -> tuple[int, int | None]:
    """Reads one layer's tensors from the checkpoint into the model (the weight to quantize
    through the staging buffer, on the quantize device). Returns its bytes as stored in the
    model before quantizing, and the id of its meta weight."""
    before = 0
    weight_id = None
    for s in module_tensors(c.name, c.module):
        meta = s.get()
        if not s.persistent:  # built for real by the factory, not in checkpoints
            continue
        before += tensor_nbytes(meta)
        if s.attr == "weight":
            weight_id = id(meta)
        if id(meta) in st.placed:  # tied: choose_layers never quantizes a shared weight
            s.module._parameters[s.attr] = st.placed[id(meta)]  # type: ignore[assignment]
            continue
        entry = _entry(st.index, st.keys, st.names, meta)
        if c.quantize and s.attr == "weight" and st.staging is not None:
            st.index.read_into(entry, byte_view(st.staging))
            t = st.staging[: entry.nbytes].view(entry.dtype).view(entry.shape)
        else:
            t = st.index.read_stored(entry)
        target = st.qdev if c.quantize else st.device
        place(s, t.to(device=target, dtype=meta.dtype), meta.requires_grad)
        st.keep_alive.append(meta)
        st.placed[id(meta)] = s.get()
    return before, weight_id


def _quantize_layer(st: _Stream, c: LayerChoice, weight_id: int | None) -> tuple[bool, str]:
    """Quantizes one filled Linear and moves it to the model's device."""
    assert isinstance(c.module, nn.Linear) and weight_id is not None
    quantized, reason = True, c.reason
    quantize_linear(c.module, st.config)
    if not is_quantized(c.module.weight):
        quantized, reason = False, DECLINED
        if st.staging is not None and _aliases(c.module.weight, st.staging):
            # Still a view of the staging buffer, which the next layer overwrites.
            weight_slot = next(s for s in module_tensors(c.name, c.module) if s.attr == "weight")
            place(weight_slot, c.module.weight.clone())
    if st.qdev != st.device:
        move_direct(c.module, st.device)
    st.placed[weight_id] = c.module.weight
    trim_heap()
    return quantized, reason
