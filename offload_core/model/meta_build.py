"""A network whose weights wait in their checkpoint: built by its host's own constructor, with
every tensor the checkpoint holds on the meta device (no bytes) until it is read from the file.

Built wholly on the meta device (the host's constructor given ``device="meta"``), a network loses what its
constructor computes: a rotary table or a position range kept as a non-persistent buffer, a
plain tensor attribute, has no value on meta, and nothing in the file gives it one. And a layer
the constructor makes without the device argument is built on the CPU anyway, randomly
initialised: it looks built, so its weights were never read from the file. Both were found in
ComfyUI core's networks (Cosmos' position embedder, HunyuanVideo 1.5's ``cond_type_embedding``).

So the host's constructor runs as the host runs it (on the CPU), while each
parameter (but a scalar: ComfyUI's scaled-fp8 Linears make a ``scale_weight`` of 1 that a
file may not hold) is put on meta as it is registered (``register_module_parameter_registration_hook``,
for this thread only: a parameter's CPU tensor lives only until it is registered, so the model
is never in RAM). Then every persistent tensor the checkpoint holds goes on meta, whatever
device it was built on: the file is its value, as ``load_state_dict`` would copy it in.
Everything else keeps the value the constructor gave it, as ``load_state_dict(strict=False)``
keeps it. A tensor the constructor computed from a weight (so it came out on meta) cannot be
had from the file nor from the build: ConfigError("build") names it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Container
from typing import TypeVar

import torch
from torch import nn
from torch.nn.modules.module import register_module_parameter_registration_hook

from ..errors import ConfigError

M = TypeVar("M", bound=nn.Module)
META = torch.device("meta")


def build_on_meta(build: Callable[[torch.device | None], M], stored: Container[str]) -> M:
    """``build(None)`` (no device: the CPU, as the host's own loader builds it) with its
    parameters on meta, then each persistent tensor whose state-dict name ``stored`` holds on
    meta too; what the build computed stays as built."""
    builder = threading.get_ident()

    def to_meta(module: nn.Module, name: str, param: nn.Parameter) -> nn.Parameter | None:
        if threading.get_ident() != builder or type(param) is not nn.Parameter:
            return None  # another thread's module, or a tensor subclass: as built
        if param.device == META or param.numel() <= 1:
            return None  # a scalar (a scale the file may not hold): its value kept, until
            # settle_on_meta puts it on meta if the file holds it
        return nn.Parameter(_on_meta(param), requires_grad=param.requires_grad)

    # Its docstring: "hook(module, name, param) -> None or new parameter"; typed as -> None.
    hook = register_module_parameter_registration_hook(to_meta)  # type: ignore[arg-type]
    try:
        model = build(None)
    finally:
        hook.remove()
    settle_on_meta(model, stored)
    return model


def settle_on_meta(model: nn.Module, stored: Container[str]) -> None:
    """After a build: each persistent tensor ``stored`` names goes on meta (the file is its
    value); a ConfigError names a computed tensor that came out on meta. For a host that
    builds on meta itself (a text encoder built with ``initial_device`` meta), whose
    constructor still makes some tensors on the CPU with their values (a CLIP's logit_scale)."""
    _stored_on_meta(model, stored)
    _check_computed(model)


def _on_meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=META)


def _stored_on_meta(model: nn.Module, stored: Container[str]) -> None:
    """Puts every persistent tensor that ``stored`` names (under any of its tied names) on
    meta, in every module that holds it."""
    held: set[int] = set()
    for mname, mod in model.named_modules(remove_duplicate=False):
        for _, attr, t in _persistent(mod):
            if t.device != META and _key(mname, attr) in stored:
                held.add(id(t))
    swapped: dict[int, torch.Tensor] = {}
    for mname, mod in model.named_modules(remove_duplicate=False):
        for table, attr, t in _persistent(mod):
            if id(t) not in held:
                continue
            if id(t) not in swapped:
                if type(t) not in (torch.Tensor, nn.Parameter):
                    raise ConfigError(
                        "build",
                        f"{_key(mname, attr)} is a {type(t).__name__} the model built itself; "
                        "it cannot wait in the file",
                    )
                meta = _on_meta(t)
                if isinstance(t, nn.Parameter):
                    meta = nn.Parameter(meta, requires_grad=t.requires_grad)
                swapped[id(t)] = meta
            table[attr] = swapped[id(t)]


def _key(module_name: str, attr: str) -> str:
    return f"{module_name}.{attr}" if module_name else attr


def _persistent(mod: nn.Module) -> list[tuple[dict, str, torch.Tensor]]:
    skip = mod._non_persistent_buffers_set
    out: list[tuple[dict, str, torch.Tensor]] = []
    out += [(mod._parameters, k, t) for k, t in mod._parameters.items() if t is not None]
    out += [
        (mod._buffers, k, t) for k, t in mod._buffers.items() if t is not None and k not in skip
    ]
    return out


def _check_computed(model: nn.Module) -> None:
    """A non-persistent buffer or a tensor attribute on meta was computed from a weight."""
    for mname, mod in model.named_modules():
        skip = mod._non_persistent_buffers_set
        computed = [(k, t) for k, t in mod._buffers.items() if k in skip]
        computed += [(k, t) for k, t in vars(mod).items() if isinstance(t, torch.Tensor)]
        for attr, t in computed:
            if t is not None and t.device == META:
                raise ConfigError(
                    "build",
                    f"{_key(mname, attr)} is computed from the weights while the model is built; "
                    "it cannot be had from the file",
                )
