"""Ferry Load Checkpoint's MODEL, CLIP and VAE from one all-in-one file: the diffusion model and
the text encoders on meta, their weights left in the file until Ferry Offload Model and Ferry
Offload Text Encoder lay them out; the VAE (small) loaded as core loads it.

Core decides everything as ``comfy.sd.load_checkpoint_guess_config`` does, on the file's
tensors as meta tensors (its header):
- the diffusion model: core's detection, dtype and ``get_model`` (given the whole state dict
  and the prefix, as core gives them: some configs read top-level keys such as ``v_pred``),
  built on meta and streamed by stream_loader.py's ``LazyCheckpoint`` under core's prefix
  ("model.diffusion_model." in SD/SDXL files);
- the text encoders and the VAE: core's own ``load_state_dict_guess_config`` (no diffusion
  model), the VAE's tensors read, the CLIP built on meta with each tensor traced to its key
  (text_encoder_stream.py's ``traced_clip``). A tensor core computes from the file's (SDXL's
  OpenCLIP-G stores q, k and v fused in one ``in_proj`` that core splits, and a transposed
  projection) is given its value by a second build of the CLIP from those file tensors read:
  it stays in RAM (0.3 GB of SDXL's 1.6 GB of encoders), the rest streams.
A file in core's quantized formats (scaled fp8, comfy_quant) or one core must convert in RAM
is not lazy: ``lazy_checkpoint`` returns None and the caller loads it whole, saying so. A plain
fp8 all-in-one file (float8 weights, no scales) is lazy like any other.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import comfy.model_detection
import comfy.model_management as mm
import comfy.model_patcher
import comfy.sd
import comfy.utils
import torch
from torch import nn

from ...offload_core import ConfigError
from ...offload_core.model import meta_build
from ...offload_core.sources.checkpoint import CheckpointIndex
from ...offload_core.sources.checkpoint_stream import CheckpointWeights
from ...offload_core.sources.load_trace import LoadTrace, header_state_dict, unsourced
from ..input_error import NodeInputError
from ..patcher import comfy_core
from ..patcher.dynamic import give_lazy_layers_meta_weights
from .core_quant_stream import reads_value
from .stream_loader import LazyCheckpoint, _held, core_quant_format
from .text_encoder_stream import META, traced_clip

log = logging.getLogger("ferry")
WIDGET = "ckpt_name"


@dataclass
class Loaded:
    """What the checkpoint gave: core's three outputs (a None where the file has none)."""

    model: Any
    clip: Any
    vae: Any


def _plain(load: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` asking core for a plain (non-dynamic) patcher where it has the choice."""
    if "disable_dynamic" in inspect.signature(load).parameters:
        return {**kwargs, "disable_dynamic": True}
    return kwargs


def core_load_checkpoint(path: str, embeddings: Any) -> Loaded:
    """``comfy.sd.load_checkpoint_guess_config`` as CheckpointLoaderSimple calls it (the
    whole file read into RAM)."""
    load = comfy.sd.load_checkpoint_guess_config
    kwargs = dict(output_vae=True, output_clip=True, embedding_directory=embeddings)
    out = load(path, **_plain(load, kwargs))
    return Loaded(out[0], out[1], out[2])


def _open(path: str) -> CheckpointIndex:
    try:
        return CheckpointIndex.open(path, WIDGET)
    except ConfigError as e:
        raise NodeInputError(WIDGET, str(e).removeprefix(f"{WIDGET}: ")) from None


def lazy_checkpoint(path: str, embeddings: Any) -> Loaded | None:
    """The checkpoint's MODEL and CLIP with their weights left in ``path`` and its VAE loaded;
    None where core must read the file whole (the log says why)."""
    index = _open(path)
    metadata = dict(index.header.metadata)
    sd = header_state_dict(index, read=lambda k: _reads(index, k))
    if core_quant_format(sd, metadata) is not None:
        return _not_lazy(path, "ComfyUI's quantized checkpoint format")
    prefix = comfy.model_detection.unet_prefix_from_state_dict(sd)
    config = comfy.model_detection.model_config_from_unet(sd, prefix, metadata=metadata)
    if config is None:
        return _not_lazy(path, "ComfyUI does not detect it as a checkpoint")
    model = _lazy_model(path, sd, prefix, config)
    if model is None:
        return None
    vae_keys = tuple(config.vae_key_prefix)
    built = _clip_and_vae(path, index, metadata, vae_keys, embeddings)
    if built is None:
        return None
    clip, vae = built
    return Loaded(model, clip, vae)


def _reads(index: CheckpointIndex, key: str) -> bool:
    """Whether core reads ``key``'s value while it builds: a value it compares, or a scalar a
    layer's constructor made for real (a CLIP's ``logit_scale``) that core copies it into."""
    return reads_value(key) or index.entries[key].shape == ()


def _not_lazy(path: str, why: str) -> None:
    log.info("ferry: %s cannot stay in its file (%s); loading it whole", path, why)
    return None


def _lazy_model(path: str, sd: dict[str, torch.Tensor], prefix: str, config: Any) -> Any | None:
    """The diffusion model on meta, as ``load_state_dict_guess_config`` builds it."""
    unet = {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)}
    load_device = mm.get_torch_device()
    unet_dtype = mm.unet_dtype(
        model_params=comfy.utils.calculate_parameters(sd, prefix),
        supported_dtypes=list(config.supported_inference_dtypes),
        weight_dtype=comfy.utils.weight_dtype(sd, prefix),
    )
    cast = mm.unet_manual_cast(unet_dtype, load_device, config.supported_inference_dtypes)
    comfy_core.set_inference_dtype(config, unet_dtype, cast, load_device)
    if set(config.process_unet_state_dict(dict(unet))) != set(unet):
        return _not_lazy(path, "ComfyUI renames its diffusion model's keys in RAM")
    held = {comfy_core.DM + k for k in unet}
    try:
        base = meta_build.build_on_meta(
            lambda device: config.get_model(sd, prefix, device=device), held
        )
        give_lazy_layers_meta_weights(base.diffusion_model)
        CheckpointWeights.open(path, base.diffusion_model, prefix=prefix, setting=WIDGET)
    except (RuntimeError, NotImplementedError, TypeError, ValueError, ConfigError) as e:
        return _not_lazy(path, str(e))
    extra = set(unet) - _held(base.diffusion_model)
    if extra:  # tensors no parameter of this network holds: core's loader knows better
        return _not_lazy(path, f"{len(extra)} tensors the network does not hold, e.g. {min(extra)}")
    base.ferry_checkpoint = LazyCheckpoint(path, prefix, setting=WIDGET)
    return comfy.model_patcher.ModelPatcher(
        base, load_device=load_device, offload_device=mm.unet_offload_device()
    )


def _core_clip_and_vae(
    sd: dict[str, torch.Tensor], metadata: dict[str, str], embeddings: Any, vae: bool
) -> tuple[Any, Any]:
    """Core's ``load_state_dict_guess_config`` with no diffusion model, the CLIP on meta."""
    load = comfy.sd.load_state_dict_guess_config
    kwargs = dict(
        output_vae=vae,
        output_clip=True,
        embedding_directory=embeddings,
        output_model=False,
        te_model_options={"initial_device": META},
        metadata=metadata,
    )
    out = load(dict(sd), **_plain(load, kwargs))
    return out[1], out[2]


def _clip_and_vae(
    path: str,
    index: CheckpointIndex,
    metadata: dict[str, str],
    vae_keys: tuple[str, ...],
    embeddings: Any,
) -> tuple[Any, Any] | None:
    def is_vae(key: str) -> bool:
        return key.startswith(vae_keys)

    sd = header_state_dict(index, read=lambda k: is_vae(k) or _reads(index, k))
    got: list[Any] = []

    def build() -> Any:
        clip, vae = _core_clip_and_vae(sd, metadata, embeddings, vae=True)
        got.append(vae)
        if clip is None:
            raise ValueError("core found no text encoder in it")
        return clip

    def fill(net: nn.Module, keys: list[dict[str, str]]) -> None:
        _fill_computed(net, index, metadata, embeddings, keys[0], vae_keys)

    clip = traced_clip([(path, WIDGET)], [sd], build, fill)
    if clip is None:
        return None
    return clip, got[0]


def _fill_computed(
    net: nn.Module,
    index: CheckpointIndex,
    metadata: dict[str, str],
    embeddings: Any,
    keys: dict[str, str],
    vae_keys: tuple[str, ...],
) -> None:
    """Gives each of ``net``'s tensors that no file key holds as stored the value core
    computes for it: a second build of the CLIP from the file with the keys no tensor was
    traced to read (the fused and transposed ones), each value taken as core gives it."""
    missing = unsourced(net, [keys])
    if not missing:
        return
    traced = set(keys.values())
    dm = comfy.model_detection.unet_prefix_from_state_dict(index.entries)

    def untraced(key: str) -> bool:
        return key not in traced and not key.startswith((dm, *vae_keys))

    sd = header_state_dict(index, read=lambda k: untraced(k) or _reads(index, k))
    trace = LoadTrace([sd], keep=True)
    with trace:
        clip, _ = _core_clip_and_vae(sd, metadata, embeddings, vae=False)
    given = trace.given(clip.cond_stage_model)
    for name in missing:
        value = given.get(name)
        if value is None and _left_uninitialized(net, name):
            value = torch.zeros(())  # what the file does not hold and core never fills
        if value is None or value.device == META:
            continue  # not_streamable names it
        _set(net, name, value)


def _left_uninitialized(net: nn.Module, name: str) -> bool:
    """Whether ``name`` is a weight core's load leaves as its layer's constructor made it, and
    that constructor leaves unset (core's ops skip ``reset_parameters``: ``torch.empty``): a
    value no output of core's depends on (SDXL's CLIP-L ``text_projection``, which the file
    does not hold and core never uses), given zeros rather than whatever memory held."""
    owner = net.get_submodule(name.rpartition(".")[0])
    return type(owner).__module__ == "comfy.ops" and hasattr(owner, "comfy_cast_weights")


def _set(net: nn.Module, name: str, value: torch.Tensor) -> None:
    """``name`` = ``value`` as ``load_state_dict`` copies it in (cast to the tensor's dtype)."""
    owner_name, _, attr = name.rpartition(".")
    owner = net.get_submodule(owner_name)
    held = owner._parameters.get(attr)
    if held is not None:
        data = value.to(held.dtype, copy=True).expand(held.shape).contiguous()
        owner._parameters[attr] = nn.Parameter(data, requires_grad=False)
    else:
        buf = owner._buffers[attr]
        assert buf is not None
        owner._buffers[attr] = value.to(buf.dtype, copy=True).expand(buf.shape).contiguous()
