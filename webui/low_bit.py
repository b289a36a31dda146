"""Forge's own low-bit UNet weights under Ferry: GGUF runs, bitsandbytes 4-bit where it can.

Forge loads a ``.gguf`` checkpoint and a bitsandbytes NF4/FP4 one natively, with weight types
of its own (the 2025-06-26 snapshot's ``backend/operations_gguf.py``, ``operations_bnb.py``).
What Ferry does with each, checked before anything moves (``check_weights``):

- **GGUF** (``ParameterGGUF``): an ``nn.Parameter`` subclass whose storage holds the raw
  quantized blocks, its ``.shape`` the dequantized one, and whose Python attributes
  (``gguf_cls``, ``real_shape``, ``computation_dtype``, ``baked``) drive its dequantization on
  every forward. No attribute holds a tensor, so Ferry's layout moves it by its storage's
  bytes and keeps the same object (``offload_core/model/layout.py``): faithful. One thing
  Forge does at load that Ferry must do for it: ``LoadedModel.model_load`` *bakes* the model
  (``bake_gguf_model``: each quantized parameter's blocks rearranged, its scales cast to the
  computation dtype, in place) on the module ``forge_patch_model`` returned, and a Ferry
  patcher returns an empty one. So ``bake_gguf`` runs Forge's own ``gguf_cls.bake`` on every
  parameter before the network is planned, merged (Forge's GGUF LoRA merge requantizes a
  baked parameter) or laid out. Baking is deterministic and idempotent (Forge skips a baked
  parameter), so the bytes are the ones Forge computes with.
- **bitsandbytes NF4/FP4** (``ForgeParams4bit``, a ``Params4bit``): the packed 4-bit bytes are
  the parameter's storage, but its ``quant_state`` (``absmax``, ``code``, and for compressed
  statistics ``offset`` and a nested state) is a separate object of separate tensors. Ferry
  moves the parameter's bytes only; the state stays where it is. bitsandbytes computes on the
  weight's device with the state it is handed, so Ferry runs such a UNet where every state
  tensor already sits on the device Ferry computes on (a CPU Forge: both on the CPU) and
  refuses it otherwise, before anything moves: Forge's own loader moves the state with the
  weight (``ForgeParams4bit.to`` copies it), Ferry does not, and moving it for Forge is not
  verified on a GPU yet. A parameter Forge has not quantized yet (``bnb_quantized`` false:
  an fp16 checkpoint Forge quantizes when it first moves it to a GPU) is refused too.
- Any other tensor Ferry cannot move faithfully (``unsupported_why``: its own
  ``__torch_dispatch__``, an attribute viewing its own bytes, sparse, torch-quantized) is
  refused here with the accordion's words rather than at the load.

Online LoRA (Forge's "(fp16 LoRA)" options in *Diffusion in Low Bits*) needs nothing: Forge
puts the patches on the layer (``forge_online_loras``) and merges them into the weight it
reads on every forward, which under Ferry is the weight in Ferry's slot.

Duck-typed (no Forge import), so CI runs it against tests/webui_standins.py.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..offload_core.model.layout import unsupported_why
from .controls import LABELS, ControlError

#: The tensors a bitsandbytes QuantState holds (a nested state holds its own).
_STATE_TENSORS = ("absmax", "code", "offset")


def bake_gguf(module: nn.Module) -> int:
    """Forge's ``bake_gguf_model`` on ``module``'s parameters; returns how many it baked."""
    n = 0
    for p in module.parameters():
        gguf_cls = getattr(p, "gguf_cls", None)
        if gguf_cls is not None and not getattr(p, "baked", False):
            gguf_cls.bake(p)
            n += 1
    return n


def _state_tensors(state: Any, where: str = "quant_state") -> list[tuple[str, torch.Tensor]]:
    out = []
    for name in _STATE_TENSORS:
        t = getattr(state, name, None)
        if isinstance(t, torch.Tensor):
            out.append((f"{where}.{name}", t))
    nested = getattr(state, "state2", None)
    if nested is not None:
        out += _state_tensors(nested, f"{where}.state2")
    return out


def _bnb_why(p: torch.Tensor, device: torch.device) -> str | None:
    kind = str(getattr(p, "quant_type", "4-bit")).upper()
    if not getattr(p, "bnb_quantized", True):
        return (
            f"a bitsandbytes {kind} weight Forge has not quantized yet (it quantizes it when it "
            "moves it to the GPU itself)"
        )
    state = getattr(p, "quant_state", None)
    away = [(n, t) for n, t in _state_tensors(state) if t.device != device]
    if away:
        n, t = away[0]
        return (
            f"a bitsandbytes {kind} weight whose quantization state ({n} and the rest) sits on "
            f"{t.device}, apart from its bytes; Ferry moves a weight's bytes only, so on "
            f"{device} it would compute with a state left behind"
        )
    return None


def check_weights(
    module: nn.Module, device: torch.device | str, *, what: str = "this UNet",
    control: str = "enabled",
) -> None:  # fmt: skip
    """Raises ControlError naming ``control`` (the one that turns Ferry off for ``what``) for
    the first tensor of ``module`` Ferry would not run as Forge does on ``device``; moves
    nothing."""
    device = torch.device(device)
    tables: list[tuple[str, torch.Tensor]] = list(module.named_parameters())
    tables += list(module.named_buffers())
    for name, t in tables:
        why_not: str | None
        if hasattr(t, "bnb_quantized"):
            why_not = _bnb_why(t, device)
        else:
            why = unsupported_why(t)
            why_not = (
                None if why is None else f"a {type(t).__name__} tensor Ferry cannot move ({why})"
            )
        if why_not is not None:
            raise ControlError(
                control,
                f"{what}'s {name} is {why_not}. Turn {LABELS[control]} off for this model "
                "(Forge's own loading runs it)",
            )
