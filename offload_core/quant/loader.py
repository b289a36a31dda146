"""load_quantized: checkpoint -> quantized model, through the cache when there is one."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from ..sources.checkpoint import CheckpointIndex
from . import cache
from .model_tensors import build_meta_model
from .presets import Preset, resolve_preset
from .report import QuantReport
from .selection import SkipRules, choose_layers
from .streaming import Progress, stream_quantize


def load_quantized(
    checkpoint_path: str | os.PathLike[str],
    build: Callable[[torch.device], nn.Module] | nn.Module,
    preset: str | Preset,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    skip: SkipRules | Sequence[str] | str | None = None,
    device: torch.device | str = "cpu",
    quantize_device: torch.device | str | None = None,
    progress: Progress | None = None,
) -> tuple[nn.Module, QuantReport]:
    """Builds the model on the meta device and fills it from a safetensors checkpoint,
    quantizing the chosen Linears one layer at a time, so the full-precision model is never
    in RAM. With ``cache_dir`` the quantized result is saved there and the next load with
    the same checkpoint, preset, skip list and device type reads it instead ("" or None:
    no cache; the "none" preset is never cached, the checkpoint is its own cache).

    build: ``build(device) -> nn.Module`` (called with the meta device), or a model already
        built under ``torch.device("meta")``.
    device: where the model ends up.
    quantize_device: where each layer is quantized before it moves to ``device`` (default
        ``device``); e.g. "cuda" for a GPU-only preset on a model kept in RAM for offloading.
    progress: ``progress(done, total)`` after each layer (a layer: a module owning tensors).
    Every setting is checked before any weight is read; a bad one raises ConfigError naming it.
    """
    start = time.perf_counter()
    dev = _device("device", device)
    qdev = _device("quantize_device", quantize_device) if quantize_device is not None else dev
    p = resolve_preset(preset, qdev)
    rules = SkipRules.from_user(skip)
    if progress is not None and not callable(progress):
        raise ConfigError("progress", "must be a callable progress(done, total) or None")
    index = CheckpointIndex.open(checkpoint_path, "checkpoint")
    if isinstance(cache_dir, str) and not cache_dir.strip():
        cache_dir = None  # an empty text field in the nodes or the panel: no cache
    folder = cache.check_cache_dir(cache_dir) if cache_dir is not None else None
    model = build_meta_model(build)
    keys = index.match(model)
    choices = choose_layers(model, p, rules)
    report = QuantReport(preset=p.name, device=str(dev))
    entry = None
    if folder is not None and p.quantizes:  # "none" would only copy the checkpoint
        entry = cache.entry_for(folder, index.header, p, rules, qdev, model)
    if entry is None or not _load_cached(entry, model, choices, dev, progress, report):
        # No entry, or one missing or unusable: quantized from the checkpoint and saved.
        report.layers = stream_quantize(model, index, keys, choices, p, dev, progress, qdev)
        if entry is not None:
            failed = cache.save(entry, choices, report)
            if failed:
                report.cache = f"{report.cache}; {failed}"
    report.seconds = time.perf_counter() - start
    return model, report


def _load_cached(
    entry: Any,
    model: nn.Module,
    choices: list[Any],
    dev: torch.device,
    progress: Progress | None,
    report: QuantReport,
) -> bool:
    """Fills ``model`` from the cache entry; False (with the reason in ``report.cache``)
    when the entry is missing or unusable and the checkpoint must be quantized again."""
    report.cache_path = str(entry.path)
    status, layers = cache.load(entry, model, choices, dev, progress)
    if layers is not None:
        report.layers, report.cache = layers, status
        return True
    report.cache = status if status == "miss" else f"{status} (rebuilt)"
    return False


def _device(setting: str, value: torch.device | str) -> torch.device:
    try:
        return torch.device(value)
    except (RuntimeError, TypeError):
        raise ConfigError(setting, f"{value!r} is not a device; try 'cpu' or 'cuda'") from None
