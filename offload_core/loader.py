"""load_offloaded: a checkpoint bigger than RAM, straight into the tiers.

The network is built on the meta device (no bytes), the checkpoint's header is checked
against it before any weight moves, and ``apply_offload`` fills each group from the file:
RAM ≈ the tensors outside the groups + the streaming window, whatever the model's size.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import torch
from torch import nn

from .api import OffloadHandle, apply_offload
from .errors import ConfigError
from .policy import OffloadPolicy
from .quant.group_stream import plan_quantized
from .quant.model_tensors import build_meta_model
from .quant.presets import Preset
from .quant.selection import SkipRules
from .sources.checkpoint_stream import CheckpointWeights, Converter
from .sources.lay_out import Progress


def load_offloaded(
    checkpoint: str | os.PathLike[str],
    build: Callable[[torch.device], nn.Module] | nn.Module,
    policy: OffloadPolicy | None = None,
    *,
    onload_device: str | torch.device | None = None,
    prefix: str = "",
    name: str | None = None,
    progress: Progress | None = None,
    convert: Converter | None = None,
    converts: Callable[[str], bool] | None = None,
    quantize: str | Preset | None = None,
    skip: SkipRules | Sequence[str] | str | None = None,
    quantize_device: str | torch.device = "cpu",
) -> OffloadHandle:
    """Builds the model on the meta device and offloads it by ``policy`` straight from the
    safetensors ``checkpoint``; the model is ``handle.model``.

    Groups whose stored bytes are what the model computes with keep the checkpoint as their
    disk-tier source (nothing written); others (the model's dtype differs from the file's, or
    ``converts(name)`` is True) are cast with ``copy_`` and passed through ``convert(name,
    tensor)``, one group at a time, into the tier. ``handle.remove()`` puts the tensors back
    on meta. A file that is not safetensors, is truncated, lies in its header or does not
    match the model raises ConfigError("checkpoint") before any weight moves.

    build: ``build(device) -> nn.Module`` (called under the meta device; buffers that are not
        saved in checkpoints must be created on the CPU) or a model already built on meta.
    prefix: the model's keys' prefix in the file (e.g. ``model.diffusion_model.``).
    quantize: a torchao preset, applied group by group as groups are filled (after
        ``convert``; see quant/group_stream.py); ``skip`` and ``quantize_device`` as in
        ``load_quantized``, whose bytes it equals. Its report is ``handle.quant_report``.
    """
    if progress is not None and not callable(progress):
        raise ConfigError("progress", "must be a callable progress(done, total) or None")
    if convert is not None and converts is None:
        raise ConfigError("converts", "say which tensors convert changes: converts(name) -> bool")
    model = build_meta_model(build)
    quantized = None
    if quantize is not None and quantize != "none":
        # Before the file is opened: a bad preset or skip list is refused first.
        quantized = plan_quantized(model, quantize, skip=skip, device=quantize_device)
        convert, converts = quantized.after(convert, converts)
    weights = CheckpointWeights.open(
        checkpoint, model, prefix=prefix, convert=convert, changed=converts
    )
    handle = apply_offload(
        model, policy, onload_device=onload_device, name=name, progress=progress, weights=weights
    )
    handle.quant_report = None if quantized is None else quantized.report
    return handle
