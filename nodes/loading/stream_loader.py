"""The Ferry loader's MODEL for a model bigger than RAM: a network on the meta device whose
weights wait in their checkpoint until Ferry Offload Model lays them out.

The config, dtype and key prefix are chosen as ``comfy.sd.load_diffusion_model`` chooses them
(same detection, same ``unet_dtype``/``manual_cast``), and each tensor is cast with ``copy_`` as
``load_state_dict`` casts, so the latents equal UNETLoader's with the same weight_dtype. The
checkpoint is the source of truth (``base.ferry_checkpoint``):
- a Ferry patcher lays the groups out straight from the file (``stream_weights``), with its
  LoRA patches computed per tensor as ``ModelPatcher.patch_weight_to_device`` computes them;
- any other load (no Ferry Offload Model after the loader) first reads the model whole
  (``materialize``), as UNETLoader would have.
Files in core's own quantized formats (legacy ``scaled_fp8`` and ``comfy_quant``) are built
by core's own conversion and ops classes on meta (core_quant_stream.py): each tensor, and each
inner tensor of a ``QuantizedTensor``, waits in the file under the key core took it from.
A file ComfyUI must convert in RAM (a diffusers layout, a quantized tensor core repacks) is not
lazy: ``lazy_diffusion_model`` returns None and the caller loads it whole, saying so.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import comfy.float
import comfy.lora
import comfy.model_detection
import comfy.model_management as mm
import comfy.model_patcher
import comfy.utils
import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ...offload_core import ConfigError
from ...offload_core.formats.safetensors import Header, read_checkpoint_header
from ...offload_core.formats.weight_dtypes import WEIGHT_DTYPES
from ...offload_core.quant.group_stream import QuantizedStream
from ...offload_core.sources.checkpoint import CheckpointIndex
from ...offload_core.sources.checkpoint_stream import CheckpointWeights, Converter
from ..input_error import NodeInputError
from ..patcher import comfy_core
from .core_quant_stream import lazy_core_quant_model

log = logging.getLogger("ferry")
WIDGET = "unet_name"
DM = comfy_core.DM
# Keys of ComfyUI's own quantized formats (comfy.utils.convert_old_quants, detect_layer_quantization).
_CORE_QUANT_KEYS = (
    ".comfy_quant",
    ".scale_weight",
    ".weight_scale",
    ".scale_input",
    ".input_scale",
)


@dataclass(frozen=True)
class LazyCheckpoint:
    """Where a lazy model's diffusion_model tensors are: ``prefix + name`` in ``path``, and
    the quantization its chosen Linears get as they are read (None: none)."""

    path: str
    prefix: str
    quant: QuantizedStream | None = None
    #: core's quantized formats: each tensor's file key as core's loader took it (None: the
    #: model's names under ``prefix``), and each QuantizedTensor's inner tensors' keys
    keys: dict[str, str] | None = None
    parts: dict[str, tuple[str, ...]] | None = None
    setting: str = WIDGET  # the widget that chose the file (errors name it)
    patch_prefix = DM  # a MODEL patcher's patch keys: the BaseModel's names

    def network(self, base: Any) -> nn.Module:
        return base.diffusion_model  # type: ignore[no-any-return]

    def weights(
        self,
        dm: nn.Module,
        convert: Converter | None = None,
        changed: Callable[[str], bool] | None = None,
    ) -> CheckpointWeights:
        """The file as ``dm``'s source: ``convert`` (a LoRA), then the quantization."""
        if self.quant is not None:
            convert, changed = self.quant.after(convert, changed)
        if self.keys is not None:
            index = CheckpointIndex.open(self.path, self.setting)
            return CheckpointWeights(index, self.keys, "", convert, changed, self.parts)
        return CheckpointWeights.open(
            self.path, dm, prefix=self.prefix, setting=self.setting, convert=convert,
            changed=changed,
        )  # fmt: skip

    def materialize(self, dm: nn.Module, device: torch.device) -> None:
        self.weights(dm).materialize(dm, device)


class Lazy(Protocol):
    """What a lazy model's ``ferry_checkpoint`` answers: ``LazyCheckpoint`` (a diffusion
    model, here) or ``LazyTextEncoder`` (a CLIP's encoders, text_encoder_stream.py)."""

    path: str
    patch_prefix: str

    def network(self, base: Any) -> nn.Module: ...

    def weights(
        self,
        net: nn.Module,
        convert: Converter | None = None,
        changed: Callable[[str], bool] | None = None,
    ) -> CheckpointWeights: ...

    def materialize(self, net: nn.Module, device: torch.device) -> None: ...


def _checkpoint_header(path: str) -> Header:
    """The file's header, read once per load (its tensors and metadata); a NodeInputError
    naming the widget where it is not a readable safetensors file."""
    try:
        return read_checkpoint_header(path, WIDGET)
    except ConfigError as e:
        raise NodeInputError(WIDGET, str(e).removeprefix(f"{WIDGET}: ")) from None


def meta_state_dict(header: Header) -> dict[str, torch.Tensor]:
    """The file's tensors as meta tensors: what ComfyUI's model detection reads."""
    return {
        k: torch.empty(e.shape, dtype=e.dtype, device="meta") for k, e in header.entries.items()
    }


def model_config(
    sd: dict[str, torch.Tensor], dtype: torch.dtype | None, metadata: dict[str, str]
) -> Any | None:
    """The model config as load_diffusion_model_state_dict sets it (None: not detected as is),
    from the tensors and the file's metadata (some models keep their config there). Only
    called for files in no quantized format of core's, so the weight dtype is the file's."""
    config = comfy.model_detection.model_config_from_unet(sd, "", metadata=metadata)
    if config is None:
        return None
    load_device = mm.get_torch_device()
    unet_dtype = dtype or mm.unet_dtype(
        model_params=comfy.utils.calculate_parameters(sd),
        supported_dtypes=list(config.supported_inference_dtypes),
        weight_dtype=comfy.utils.weight_dtype(sd),
    )
    cast = mm.unet_manual_cast(unet_dtype, load_device, config.supported_inference_dtypes)
    comfy_core.set_inference_dtype(config, unet_dtype, cast, load_device)
    return config


def core_quant_format(keys: Any, metadata: dict[str, str]) -> str | None:
    """Which of ComfyUI's own quantized checkpoint formats the file is in (None: none)."""
    if "_quantization_metadata" in metadata:
        return "comfy_quant"
    keys = list(keys)
    if any(k.endswith("scaled_fp8") for k in keys):
        return "fp8_scaled"
    return "comfy_quant" if any(k.endswith(_CORE_QUANT_KEYS) for k in keys) else None


def _not_lazy(path: str, why: str) -> None:
    log.info("ferry: %s cannot stay in its file (%s); loading it whole", path, why)


def lazy_diffusion_model(
    path: str, weight_dtype: str, quantize: Callable[[nn.Module], QuantizedStream] | None = None
) -> Any | None:
    """A ModelPatcher whose diffusion model is on meta, its weights left in ``path``; None
    where ComfyUI's own loader must convert the file (the caller loads it whole).
    ``quantize(dm)`` plans a torchao preset on the meta network (``plan_quantized``): its
    Linears are then quantized group by group as they are read."""
    header = _checkpoint_header(path)
    sd, metadata = meta_state_dict(header), header.metadata
    quant_format = core_quant_format(sd, metadata)
    if quant_format is not None:
        return _lazy_core_quant(path, quant_format, weight_dtype, quantize)
    prefix = comfy.model_detection.unet_prefix_from_state_dict(sd)
    stripped = comfy.utils.state_dict_prefix_replace(sd, {prefix: ""}, filter_keys=True)
    if stripped:
        sd = stripped
    else:
        prefix = ""
    config = model_config(sd, WEIGHT_DTYPES[weight_dtype], metadata)
    if config is None or set(config.process_unet_state_dict(dict(sd))) != set(sd):
        return None  # a diffusers layout or renamed keys: ComfyUI converts them in RAM
    try:
        base = comfy_core.build_on_meta(config, sd)
        CheckpointWeights.open(path, base.diffusion_model, prefix=prefix, setting=WIDGET)
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as e:
        _not_lazy(path, str(e))
        return None
    extra = set(sd) - _held(base.diffusion_model)
    if extra:  # tensors no parameter of this network holds: core's loader knows better
        _not_lazy(path, f"{len(extra)} tensors the network does not hold, e.g. {min(extra)}")
        return None
    quant = None if quantize is None else quantize(base.diffusion_model)
    base.ferry_checkpoint = LazyCheckpoint(path, prefix, quant)
    return comfy.model_patcher.ModelPatcher(
        base, load_device=mm.get_torch_device(), offload_device=mm.unet_offload_device()
    )


def _lazy_core_quant(
    path: str,
    quant_format: str,
    weight_dtype: str,
    quantize: Callable[[nn.Module], QuantizedStream] | None,
) -> Any | None:
    """A file in core's ``quant_format``, built on meta by core's own conversion and ops."""
    if quantize is not None:  # a torchao preset on a quantized file: refused by its caller
        _not_lazy(path, f"ComfyUI's {quant_format} format is already quantized")
        return None
    try:
        built = lazy_core_quant_model(path, WIDGET, WEIGHT_DTYPES[weight_dtype])
    except ConfigError as e:
        raise NodeInputError(WIDGET, str(e).removeprefix(f"{WIDGET}: ")) from None
    if isinstance(built, str):
        _not_lazy(path, f"ComfyUI's {quant_format} format: {built}")
        return None
    base, keys, parts = built
    base.ferry_checkpoint = LazyCheckpoint(path, "", None, keys, parts)
    log.info(
        "ferry: %s (ComfyUI's %s format) stays in its file: %d quantized layers streamed as stored",
        path,
        quant_format,
        len(parts),
    )
    return comfy.model_patcher.ModelPatcher(
        base, load_device=mm.get_torch_device(), offload_device=mm.unet_offload_device()
    )


def _held(dm: nn.Module) -> set[str]:
    return {n for n, _ in dm.named_parameters()} | {n for n, _ in dm.named_buffers()}


def is_lazy(base: Any) -> bool:
    lazy: Lazy | None = getattr(base, "ferry_checkpoint", None)
    net = None if lazy is None else lazy.network(base)
    if net is None:
        return False
    return any(p.device.type == "meta" for p in net.parameters())


def materialize(base: Any, device: torch.device) -> None:
    """Reads the whole network from its file(s) onto ``device`` (a plain load)."""
    lazy: Lazy = base.ferry_checkpoint
    log.info("ferry: reading %s whole (no Ferry offload node after the loader)", lazy.path)
    lazy.materialize(lazy.network(base), device)


def stream_weights(patcher: Any, device_to: torch.device) -> CheckpointWeights | None:
    """The checkpoint as the source of a Ferry layout, with the patcher's weight patches
    computed per tensor; None where a patch needs ComfyUI's own path (then materialize)."""
    base = patcher.model
    if not is_lazy(base):
        return None
    lazy: Lazy = base.ferry_checkpoint
    pre = lazy.patch_prefix
    patches = patcher.patches
    by_core: set[str] = set()  # quantized layers: core's own patch_weight_to_device per tensor
    for key in patches:
        _, set_func, convert_func = comfy.model_patcher.get_key_weight(base, key)
        if not key.startswith(pre):
            materialize(base, patcher.offload_device)
            return None
        if set_func is not None or convert_func is not None:
            if _needs_other_tensors(base, key):  # v0.3.64's scale_weight beside the weight
                materialize(base, patcher.offload_device)
                return None
            by_core.add(key)

    temp_dtype = comfy_core.lora_compute_dtype(device_to)
    # The layout keeps ``convert``: a strong reference to the patcher would make a cycle that
    # keeps a dropped model (and its layout) alive until the garbage collector runs.
    owner = weakref.ref(patcher)

    def convert(name: str, weight: torch.Tensor) -> torch.Tensor:
        # ModelPatcher.patch_weight_to_device, without the backup copy (the file is the backup):
        # in the dtype that core computes a LoRA in (lora_compute_dtype: float16 on most NVIDIA
        # cards since v0.4), rounded back with core's per-key seed.
        key = pre + name
        if key in by_core:
            held = owner()
            assert held is not None, "the patcher laying its model out is alive"
            return core_patched(held, key, weight, device_to)
        temp = mm.cast_to_device(weight, device_to, temp_dtype, copy=True)
        out = comfy.lora.calculate_weight(patches[key], temp, key)
        seed = comfy_core.string_to_seed(key)
        out = comfy.float.stochastic_rounding(out, weight.dtype, seed=seed)
        return out.to("cpu")

    return lazy.weights(lazy.network(base), convert, lambda name: pre + name in patches)


def _needs_other_tensors(base: Any, key: str) -> bool:
    """Whether the layer holding ``key`` keeps more of its weight's value in tensors still in
    the file (on meta) than the weight itself (a bias aside): core's ``set_func`` /
    ``convert_func`` would read them (v0.3.64's scaled-fp8 ``scale_weight``). A layer whose
    quantized weight holds its own scales (a ``QuantizedTensor``) does not."""
    owner_name, _, attr = key.rpartition(".")
    owner = base.get_submodule(owner_name)
    weight = owner._parameters.get(attr)
    if weight is not None and is_traceable_wrapper_subclass(weight):
        return False
    return any(
        t is not None and name not in (attr, "bias") and t.device.type == "meta"
        for name, t in owner._parameters.items()
    )


def core_patched(patcher: Any, key: str, weight: torch.Tensor, device_to: torch.device) -> Any:
    """Core's own ``ModelPatcher.patch_weight_to_device`` (``comfy_core.patched_weight``) on
    ``weight``, a quantized layer's weight just read from the file (a ``QuantizedTensor``
    holding its scales), put in the layer's place for the call: core dequantizes it
    (``convert_func``), computes the patch in its LoRA dtype and quantizes the result again
    (``set_func``, its per-key seed), as its own load computes it; no backup (the file is)."""
    owner_name, _, attr = key.rpartition(".")
    owner = patcher.model.get_submodule(owner_name)
    held = owner._parameters[attr]
    owner._parameters[attr] = nn.Parameter(weight, requires_grad=False)
    try:
        out = comfy_core.patched_weight(patcher, key, device_to)
    finally:
        owner._parameters[attr] = held
    return out.to("cpu")


def unstreamed_patches(patcher: Any, weights: CheckpointWeights) -> list[str]:
    """The patcher's patch keys whose tensors ``weights`` (the streamed file) does not hold:
    a lazy text encoder's other files, read whole into the module by ``weights``."""
    pre = patcher.model.ferry_checkpoint.patch_prefix
    return [k for k in patcher.patches if k[len(pre) :] not in weights.keys]


def bytes_to_write(patcher: Any, plan: Any) -> int | None:
    """What a disk layout of the Ferry loader's model writes to Ferry's folder with the
    patches it has now: its streamed groups that are not read verbatim from the checkpoint
    (a dtype change, a LoRA, a preset); None for any other model (every streamed group)."""
    base = patcher.model
    if not is_lazy(base):
        return None
    lazy: Lazy = base.ferry_checkpoint
    patches = patcher.patches
    weights = lazy.weights(
        lazy.network(base), None, lambda name: lazy.patch_prefix + name in patches
    )
    return sum(
        spec.nbytes
        for spec, gp in zip(plan.grouping.groups, plan.groups)
        if not gp.resident and not weights.reads_verbatim(spec.entries)
    )
