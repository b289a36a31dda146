"""Ferry's loaders for files in ComfyUI's own quantized formats: legacy ``fp8_scaled`` (a
``scaled_fp8`` marker and ``<layer>.scale_weight``) and ``comfy_quant`` (``<layer>.comfy_quant``
configs or the header's ``_quantization_metadata``: fp8, mixed fp8/bf16, NVFP4, MXFP8, ...).

Core decides everything, as its own loader would for that file: the file's tensors as meta
tensors (``header_state_dict``: its small non-float tensors, such as the per-layer JSON
configs, read) go through core's ``convert_old_quants`` (v0.8+; v0.3.64's model detection pops
the ``scaled_fp8`` marker itself), core's model detection and dtype choice, the network built
on meta (``comfy_core.build_on_meta``), then core's own ``load_model_weights``: its ops classes
(``mixed_precision_ops`` / ``scaled_fp8_ops``) build each quantized layer's weight, a
``QuantizedTensor`` on meta around the file's fp8 data and scales. Which file tensor each
tensor (and each inner tensor of a ``QuantizedTensor``) came from is seen, not guessed
(offload_core/sources/load_trace.py), so Ferry's layout reads them from the file as stored and
rebuilds the same ``QuantizedTensor`` around them at each load. A file whose tensors core
changed on the way (a cast it does itself, a layout it repacks) is not lazy: the caller loads
it whole and the log says which tensor.
"""

from __future__ import annotations

import logging
from typing import Any

import comfy.model_detection
import comfy.model_management as mm
import comfy.utils
import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ...offload_core import ConfigError
from ...offload_core.sources.checkpoint import CheckpointIndex
from ...offload_core.sources.load_trace import LoadTrace, header_state_dict, unsourced
from ..patcher import comfy_core

log = logging.getLogger("ferry")

#: Float tensors core reads a value of while it loads: ``convert_old_quants`` drops a legacy
#: ``scale_input`` equal to 1.0 (``.item()``), so it is read, not left on meta.
_READ_BY_CORE = (".scale_input",)


def reads_value(key: str) -> bool:
    return key.endswith(_READ_BY_CORE)


def convert_quants(
    sd: dict[str, torch.Tensor], metadata: dict[str, str] | None
) -> tuple[dict[str, torch.Tensor], dict[str, str] | None]:
    """Core's ``comfy.utils.convert_old_quants`` (v0.8+): legacy fp8_scaled keys renamed into
    comfy_quant ones, the header's ``_quantization_metadata`` turned into per-layer configs;
    a core without it (v0.3.64) reads fp8_scaled in its model detection and ops."""
    convert = getattr(comfy.utils, "convert_old_quants", None)
    if convert is None:
        return sd, metadata
    out, md = convert(sd, "", metadata=metadata)
    return out, md


def _quantized(config: Any) -> bool:
    """Core detected quantized layers (v0.8+: ``quant_config``; v0.3.64: ``scaled_fp8``, read
    from the instance: v0.33 warns on the attribute)."""
    return (
        vars(config).get("quant_config") is not None or vars(config).get("scaled_fp8") is not None
    )


Built = tuple[Any, dict[str, str], dict[str, tuple[str, ...]]]


def lazy_core_quant_model(path: str, setting: str, dtype: torch.dtype | None) -> Built | str:
    """(base model on meta, the file key of each tensor, the file keys of each
    QuantizedTensor's inner tensors) as core's ``load_diffusion_model_state_dict`` builds it
    from ``path``; a string saying why not where core changes the file's tensors on the way."""
    index = CheckpointIndex.open(path, setting)
    original = header_state_dict(index, read=reads_value)
    sd, metadata = convert_quants(dict(original), dict(index.header.metadata))
    prefix = comfy.model_detection.unet_prefix_from_state_dict(sd)
    stripped = comfy.utils.state_dict_prefix_replace(sd, {prefix: ""}, filter_keys=True)
    if stripped:
        sd, metadata = convert_quants(stripped, metadata)
    config = comfy.model_detection.model_config_from_unet(sd, "", metadata=metadata)
    if config is None:
        return "ComfyUI's model detection does not know this layout"
    load_device = mm.get_torch_device()
    quantized = _quantized(config)
    unet_dtype = dtype or mm.unet_dtype(
        model_params=comfy.utils.calculate_parameters(sd),
        supported_dtypes=list(config.supported_inference_dtypes),
        weight_dtype=None if quantized else comfy.utils.weight_dtype(sd),
    )
    # As load_diffusion_model_state_dict: with comfy_quant layers the cast is chosen as for
    # no dtype (v0.8+); v0.3.64's scaled fp8 chooses it from the model's dtype.
    has_quant_config = vars(config).get("quant_config") is not None
    cast = mm.unet_manual_cast(
        None if has_quant_config else unet_dtype, load_device, config.supported_inference_dtypes
    )
    comfy_core.set_inference_dtype(config, unet_dtype, cast, load_device)
    trace = LoadTrace([original])
    try:
        with trace:
            base = comfy_core.build_on_meta(config, sd)
            base.load_model_weights(dict(sd), "")
    except (RuntimeError, NotImplementedError, TypeError, ValueError, ConfigError) as e:
        return str(e)
    dm: nn.Module = base.diffusion_model
    keys = trace.sources(dm)[0]
    parts = trace.inner_sources(dm)[0]
    why = not_streamable(dm, keys, parts)
    if why is not None:
        return why
    return base, keys, parts


def not_streamable(
    net: nn.Module, keys: dict[str, str], parts: dict[str, tuple[str, ...]]
) -> str | None:
    """Why ``net``'s tensors cannot all be read from the file(s) (None: they can). A scalar
    the file leaves to a layer's constructor gets the constructor's value first
    (``constructor_scalars``)."""
    missing = [n for n in unsourced(net, [keys]) if n not in parts]
    missing = constructor_scalars(net, missing)
    built = [n for n in subclasses_on_meta(net) if n not in parts]
    if built:
        return (
            f"{len(built)} quantized tensors core did not build from the file's tensors as "
            f"stored, e.g. {built[0]}"
        )
    if missing:
        return (
            f"{len(missing)} tensors core did not take verbatim from the file "
            f"(converted, or left to the constructor), e.g. {missing[0]}"
        )
    return None


def constructor_scalars(net: nn.Module, names: list[str]) -> list[str]:
    """Gives each scalar parameter of ``names`` that a Linear layer's constructor makes and the
    file does not hold (v0.3.64's scaled-fp8 Linears make ``scale_weight`` / ``scale_input``
    from their weight's device: on meta in a network built there) the value that constructor
    gives it, read from one twin of the layer built on the CPU (the layer's own class, its
    sizes: transient); returns the names still without a value."""
    left = []
    for name in names:
        mname, _, attr = name.rpartition(".")
        mod = net.get_submodule(mname)
        t = mod._parameters.get(attr)
        if t is None or t.numel() > 1 or not hasattr(mod, "in_features"):
            left.append(name)
            continue
        try:
            twin = type(mod)(mod.in_features, mod.out_features, bias=False, device="cpu")
        except (RuntimeError, TypeError, ValueError):
            left.append(name)
            continue
        value = getattr(twin, attr, None)
        if not isinstance(value, torch.Tensor) or value.device.type == "meta":
            left.append(name)
            continue
        mod._parameters[attr] = nn.Parameter(value.detach().clone(), requires_grad=False)
    return left


def subclasses_on_meta(net: nn.Module) -> list[str]:
    """The network's tensor subclasses (QuantizedTensor) still on meta, by name."""
    out = []
    for mname, mod in net.named_modules(remove_duplicate=False):
        for attr, t in (*mod._parameters.items(), *mod._buffers.items()):
            if t is not None and t.device.type == "meta" and is_traceable_wrapper_subclass(t):
                out.append(f"{mname}.{attr}" if mname else attr)
    return out
