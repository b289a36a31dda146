"""ComfyUI >= 0.15 "dynamic VRAM" (comfy-aimdo), as Ferry meets it: a plain ModelPatcher Ferry
can drive, and the layers core now builds without weights.

What aimdo turns on that reaches Ferry (read in ComfyUI v0.33.0; main.py switches it on when
comfy-aimdo initialises a CUDA/ROCm device, never on a CPU):
- ``comfy.model_patcher.CoreModelPatcher`` becomes ``ModelPatcherDynamic``: it streams the
  weights itself (aimdo's VBAR), so two offloaders on one model would fight. Ferry drives a
  non-dynamic *delegate* of the same file instead. ``ModelPatcherDynamic.
  get_non_dynamic_delegate()`` builds one and caches it on that patcher;
  ``clone(disable_dynamic=True)`` re-runs the loader (``cached_patcher_init``) on every call.
- ``comfy.memory_management.aimdo_enabled``: whatever the patcher,
  ``comfy.ops.disable_weight_init.Linear.__init__`` leaves ``weight``/``bias`` None and its
  ``_load_from_state_dict`` (``_lazy_load_from_state_dict``) assigns the file's tensor in the
  FILE's dtype: the dtype the model was built for (``weight_comfy_model_dtype``, e.g.
  UNETLoader's fp8 ``weight_dtype``) is applied later by the dynamic patcher's casts, which a
  plain patcher never runs.

Duck-typed and pure PyTorch (no ComfyUI import), so CI tests it against stand-ins.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

log = logging.getLogger("ferry")

#: On a dynamic model's BaseModel: core's override tuple for its non-dynamic delegate
#: (``ModelPatcher.get_clone_model_override()``), shared by every clone of that model.
DELEGATE = "ferry_non_dynamic_delegate"
DYNAMIC_VRAM_FLAG = "--disable-dynamic-vram"
DYNAMIC_VRAM_HELP = (
    "Ferry Offload Model: this MODEL is loaded with ComfyUI's dynamic VRAM (comfy-aimdo), which "
    "streams its weights itself, and ComfyUI cannot load a plain copy of it for Ferry{why}. "
    "Ferry leaves this model to ComfyUI's dynamic VRAM (the tier, budget and disk settings of "
    f"this node do nothing). To offload it with Ferry, start ComfyUI with {DYNAMIC_VRAM_FLAG}."
)
_said: set[str] = set()


def is_dynamic(model: Any) -> bool:
    fn = getattr(model, "is_dynamic", None)
    return bool(fn()) if callable(fn) else False


def say_once(key: str, message: str) -> bool:
    """Logs ``message`` as a warning the first time ``key`` is seen; True when it did."""
    if key in _said:
        return False
    _said.add(key)
    log.warning("ferry: %s", message)
    return True


def plain_patcher(model: Any) -> tuple[Any | None, str | None]:
    """(``model`` itself or the non-dynamic delegate of its dynamic model, None) or, where core
    cannot make one, (None, why). One delegate per dynamic model: built once (core's cached one),
    kept on the dynamic BaseModel and shared by every clone, so a node that runs again gets the
    same BaseModel (Ferry's layout is kept) and the file is read, and held in RAM, once."""
    if not is_dynamic(model):
        return model, None
    base = model.model
    try:
        if callable(getattr(model, "get_non_dynamic_delegate", None)):
            if getattr(model, "non_dynamic_delegate_model", None) is None:
                model.non_dynamic_delegate_model = base.__dict__.get(DELEGATE)
            src = model.get_non_dynamic_delegate()
            base.__dict__[DELEGATE] = model.non_dynamic_delegate_model
        else:  # a core between 0.15 and the cached delegate: one load per call
            src = model.clone(disable_dynamic=True)
    except (TypeError, RuntimeError) as e:  # an older signature, or no loader to re-run
        return None, f" ({e})"
    if is_dynamic(src):
        return None, ""
    restore_model_dtypes(getattr(src.model, "diffusion_model", src.model))  # a CLIP's: itself
    return src, None


def restore_model_dtypes(module: nn.Module) -> int:
    """Casts each tensor core loaded lazily in the file's dtype to the dtype the model was built
    for (``<name>_comfy_model_dtype``, set by ``comfy.model_management.archive_model_dtypes`` and
    by the lazy ``Linear.__init__``), as a plain ``load_state_dict`` would have cast it; returns
    how many it cast. Quantized tensors (core's QuantizedTensor) are left as they are."""
    n = 0
    for m in module.modules():
        for name, p in list(m._parameters.items()):
            cast = _in_model_dtype(m, name, p)
            if cast is not None:
                m._parameters[name] = nn.Parameter(cast, requires_grad=False)
                n += 1
        for name, b in list(m._buffers.items()):
            cast = _in_model_dtype(m, name, b)
            if cast is not None:
                m._buffers[name] = cast
                n += 1
    return n


def _in_model_dtype(m: nn.Module, name: str, t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` cast to the dtype ``m`` was built with for ``name``; None where it already has it
    (or nothing says which, or it is not a plain floating-point tensor)."""
    want = getattr(m, f"{name}_comfy_model_dtype", None)
    if (
        t is None
        or not isinstance(want, torch.dtype)
        or t.dtype == want
        or type(t.data) is not torch.Tensor
        or not (t.is_floating_point() and want.is_floating_point)
    ):
        return None
    return t.detach().to(want)


def give_lazy_layers_meta_weights(module: nn.Module) -> int:
    """Gives each layer core built without weights (``comfy_need_lazy_init_bias`` marks one:
    ``disable_weight_init.Linear.__init__`` with aimdo_enabled) meta tensors shaped and typed as
    ``torch.nn.Linear.__init__(device="meta", dtype=...)`` makes them, so a network built on the
    meta device has every weight its checkpoint fills; returns how many layers it completed."""
    n = 0
    for m in module.modules():
        if not hasattr(m, "comfy_need_lazy_init_bias") or m._parameters.get("weight") is not None:
            continue
        shape = (int(m.out_features), int(m.in_features))
        m.weight = _meta_param(shape, getattr(m, "weight_comfy_model_dtype", None))
        if m.comfy_need_lazy_init_bias and m._parameters.get("bias") is None:
            m.bias = _meta_param(shape[:1], getattr(m, "bias_comfy_model_dtype", None))
        n += 1
    return n


def _meta_param(shape: tuple[int, ...], dtype: torch.dtype | None) -> nn.Parameter:
    t = torch.empty(shape, dtype=dtype or torch.get_default_dtype(), device="meta")
    return nn.Parameter(t, requires_grad=False)
