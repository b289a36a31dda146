"""Loading a diffusion model from ComfyUI's diffusion_models folder, quantized on the way in.

ComfyUI detects the architecture from the file's keys and shapes; Ferry builds the network on
the meta device with that config and lets offload_core.quant fill it layer by layer (quantizing
each Linear as it arrives, through the cache when asked), so the full-precision model is never
in RAM. A file that needs ComfyUI's key conversion (diffusers layout, prefixes) or a network
with computed buffers falls back to ComfyUI's own load followed by in-place quantization.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import comfy.model_management as mm
import comfy.model_patcher
import folder_paths
import torch

from ...offload_core import ConfigError
from ...offload_core.formats.safetensors import Header, read_checkpoint_header
from ...offload_core.model.layout import module_nbytes
from ...offload_core.quant import load_quantized, quantize_model, resolve_preset
from ...offload_core.quant.group_stream import plan_quantized
from ...offload_core.runtime.memory import system_available_ram
from ...offload_core.units import fmt_bytes
from ..input_error import NodeInputError
from ..patcher import comfy_core
from .stream_loader import core_quant_format, lazy_diffusion_model, meta_state_dict, model_config

log = logging.getLogger("ferry")
Progress = Callable[[int, int], None]
# offload_core.quant's settings -> this node's inputs
_WIDGET = {"quant_preset": "quant_preset", "cache_dir": "cache", "checkpoint": "unet_name"}


def cache_dir() -> str:
    return os.path.join(folder_paths.models_dir, "ferry-cache")


def _node_error(e: ConfigError) -> NodeInputError:
    msg = str(e).removeprefix(f"{e.setting}: ")
    return NodeInputError(_WIDGET.get(e.setting, e.setting), msg)


def check_preset(preset: str, device: torch.device) -> None:
    try:
        resolve_preset(preset, device)
    except ConfigError as e:
        raise _node_error(e) from None


def _streamed(
    header: Header, path: str, preset: str, cache: bool, device: torch.device, progress: Progress
) -> Any | None:
    """The streaming path, or None where this file needs ComfyUI's own loader. Only for
    files in no quantized format of core's (the caller refuses those)."""
    sd = meta_state_dict(header)
    config = model_config(sd, None, header.metadata)
    if config is None:
        return None
    load_device = mm.get_torch_device()
    try:
        base = comfy_core.build_on_meta(config, sd)
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as e:
        # A network that computes tensors while it is built cannot be built on meta.
        log.info("ferry: cannot build %s on the meta device (%s); using ComfyUI's loader", path, e)
        return None
    quantize_device = _quantize_device(preset, device)
    try:
        _, report = load_quantized(
            path,
            base.diffusion_model,
            preset,
            cache_dir=cache_dir() if cache else None,
            device=device,
            quantize_device=quantize_device,
            progress=progress,
        )
    except ConfigError as e:
        if e.setting in ("checkpoint", "build"):
            log.info("ferry: %s; using ComfyUI's loader, then quantizing", e)
            return None
        raise
    log.info("ferry: %s", report.summary())
    return comfy.model_patcher.ModelPatcher(base, load_device=load_device, offload_device=device)


def _quantize_device(preset: str, offload: torch.device) -> torch.device:
    """Where each Linear is quantized: the offload device, or the GPU for a GPU-only preset
    (the model still waits in RAM)."""
    try:
        resolve_preset(preset, offload)
        return offload
    except ConfigError:
        return mm.get_torch_device()


def lazy_quantized(path: str, preset: str, cache: bool) -> Any | None:
    """The Ferry loader's model with ``preset`` planned on the meta network, quantized group
    by group as Ferry Offload Model lays it out (or whole by a plain load); None where the
    cache should serve instead (asked for, and the quantized model fits in half the RAM
    this process can still take) or the file needs ComfyUI's own loader."""
    qdev = _quantize_device(preset, mm.unet_offload_device())
    try:
        lazy = lazy_diffusion_model(
            path, "default", lambda dm: plan_quantized(dm, preset, device=qdev)
        )
    except ConfigError as e:
        raise _node_error(e) from None
    if lazy is None:
        return None
    size = module_nbytes(lazy.model.diffusion_model)
    available = system_available_ram()
    if cache and size <= available // 2:
        return None
    log.info(
        "ferry: %s quantized with %s is %s, %s of RAM available: quantizing group by group as "
        "Ferry Offload Model lays it out%s",
        os.path.basename(path),
        preset,
        fmt_bytes(size),
        fmt_bytes(available),
        " (the cache is used only for models that fit in half of it)" if cache else "",
    )
    return lazy


def load_quantized_diffusion_model(path: str, preset: str, cache: bool, progress: Progress) -> Any:
    """A MODEL (ModelPatcher) for ``path`` with ``preset`` applied to its Linear layers,
    quantized whole (through the cache) or, when it would not fit, group by group."""
    offload = mm.unet_offload_device()
    check_preset(preset, mm.get_torch_device())
    if preset == "none":
        return comfy_core.load_diffusion_model(path)
    lazy = lazy_quantized(path, preset, cache)
    if lazy is not None:
        return lazy
    header = read_checkpoint_header(path)
    quantized = core_quant_format(header.entries, header.metadata)
    if quantized is not None:
        raise NodeInputError(
            "quant_preset",
            f"{os.path.basename(path)} is already quantized (ComfyUI's {quantized} format); "
            "load it with quant_preset none",
        )
    try:
        patcher = _streamed(header, path, preset, cache, offload, progress)
        if patcher is None:
            # A plain patcher (not core's dynamic one, whose delegate would read the file
            # again, unquantized), quantized in place.
            patcher = comfy_core.load_diffusion_model(path)
            report = quantize_model(patcher.model.diffusion_model, preset, device=offload)
            log.info("ferry: %s", report.summary())
    except ConfigError as e:
        raise _node_error(e) from None
    return patcher
