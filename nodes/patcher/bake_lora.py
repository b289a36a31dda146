"""``bake_lora`` in ComfyUI: GGUF weights that carry LoRA patches computed once at layout
(offload_core/model/bake.py: [Note: baking a patched weight]).

``GGUFModelPatcher.patch_weight_to_device`` leaves a quantized weight as it is and hangs the
patches on it (``weight.patches``); ComfyUI-GGUF's layer then computes on every forward, in
``GGMLLayer.cast_bias_weight``: ``get_weight(weight.to(device), dtype)`` (dequantize, core's
``calculate_weight`` over the patches) and ``comfy.ops.cast_to(…, dtype, device)``. Baking
calls exactly those, on the load device, in the dtype the network computes in, and puts the
result in the module as a plain weight; the layer then takes its non-GGUF path, which casts a
weight already of the input's dtype to nothing, so the output is the per-forward one, bit for
bit. The patch-free GGUF weight is kept as ComfyUI's own backup of the key, so an unpatch (a
LoRA removed, another patcher's load) puts it back as it keeps any patched weight.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

import comfy.utils
import torch

from ...offload_core.model.bake import BakeChoice, BakeTarget, bake_patched, measure_copy_gbps
from ...offload_core.model.layout import tensor_nbytes
from ...offload_core.planner.disk_speed import cached as disk_speed
from ...offload_core.policy import DiskTier, OffloadPolicy

log = logging.getLogger("ferry")
Backup = collections.namedtuple("Backup", ["weight", "inplace_update"])  # core's own shape
#: One copy-speed measurement per device, for the process.
_SPEEDS: dict[str, float] = {}


def bake_lora(patcher: Any, device: torch.device, policy: OffloadPolicy) -> BakeChoice | None:
    """Bakes the patcher's patched GGUF weights as ``policy.bake_lora`` says; says so in the
    log. None where nothing carries patches (or the mode is off)."""
    if policy.bake_lora == "off" or not patcher.ferry_site.bakes:
        return None  # the panel's setting on a network that does not bake (seam/site.py)
    dtype = compute_dtype(patcher.model)
    targets = [t for key in patcher.patches if (t := _target(patcher, key, device, dtype))]
    if not targets:
        return None

    def copy_gbps() -> float:
        name = str(device)
        if name not in _SPEEDS:
            _SPEEDS[name] = measure_copy_gbps(torch.device(device))
        speed = _SPEEDS[name]
        if isinstance(policy.tier, DiskTier):
            speed = min(speed, disk_speed(policy.tier.path)[0])
        return speed

    def keep(t: BakeTarget, baked: torch.Tensor) -> None:
        orig = t.module._parameters[t.name]
        assert orig is not None
        orig.patches = []  # what ComfyUI-GGUF's own unpatch does to it
        if t.key not in patcher.backup:
            patcher.backup[t.key] = Backup(orig, False)
        host = baked.to(patcher.offload_device)
        comfy.utils.set_attr_param(patcher.model, t.key, host)

    choice = bake_patched(targets, policy.bake_lora, copy_gbps, keep)
    log.info("ferry: %s", choice.describe())
    return choice


def compute_dtype(model: Any) -> torch.dtype | None:
    """The dtype the network's layers get their input in (what ``BaseModel.apply_model``
    casts to): the manual cast dtype where there is one, else the model's."""
    cast = getattr(model, "manual_cast_dtype", None)
    if cast is not None:
        return cast  # type: ignore[no-any-return]
    get = getattr(model, "get_dtype", None)
    return get() if callable(get) else None


def _target(
    patcher: Any, key: str, device: torch.device, dtype: torch.dtype | None
) -> BakeTarget | None:
    """The key's weight as a bake target where it is a GGUF weight carrying patches in a
    layer that computes it per forward; None for any other (core baked those already)."""
    if dtype is None or "." not in key:
        return None
    module_path, name = key.rsplit(".", 1)
    module = comfy.utils.get_attr(patcher.model, module_path)
    weight = module._parameters.get(name) if isinstance(module, torch.nn.Module) else None
    patches = getattr(weight, "patches", None)
    if weight is None or not patches or not callable(getattr(module, "get_weight", None)):
        return None

    import comfy.ops as comfy_ops  # here: what ComfyUI-GGUF's layer calls (CI's stand-in core has none)

    def compute() -> torch.Tensor:
        # GGMLLayer.cast_bias_weight, for this one tensor (weight or bias: the same calls).
        w = module.get_weight(weight.to(device), dtype)
        return comfy_ops.cast_to(w, dtype, device, non_blocking=False, copy=False)  # type: ignore[no-any-return]

    stored = _bytes_held(weight) + _bytes_held(patches)
    return BakeTarget(key, module, name, stored, compute)


def _bytes_held(value: Any) -> int:
    """Bytes of every tensor in ``value`` (a tensor, or patches: nested tuples and lists),
    each by the one size rule (``tensor_nbytes``: a GGUF tensor by its storage, its
    ``.shape`` being the dequantized one; a torchao tensor by its inner tensors)."""
    if isinstance(value, torch.Tensor):
        return tensor_nbytes(value)
    if isinstance(value, (tuple, list)):
        return sum(_bytes_held(v) for v in value)
    inner = getattr(value, "weights", None)  # a weight adapter (LoRAAdapter: its tensors)
    return _bytes_held(inner) if inner is not None else 0
