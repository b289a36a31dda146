"""The tensors a model owns, module by module, and putting real tensors in place of meta ones."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import ConfigError


@dataclass(frozen=True)
class ModuleTensor:
    """One parameter or buffer of one module, as named in a state dict."""

    module_name: str
    module: nn.Module
    attr: str
    is_buffer: bool
    persistent: bool

    @property
    def key(self) -> str:
        return f"{self.module_name}.{self.attr}" if self.module_name else self.attr

    def get(self) -> torch.Tensor:
        table = self.module._buffers if self.is_buffer else self.module._parameters
        t = table[self.attr]
        assert t is not None
        return t


def module_tensors(name: str, module: nn.Module) -> list[ModuleTensor]:
    """The parameters and buffers ``module`` owns directly (not its children's)."""
    slots = [
        ModuleTensor(name, module, k, False, True)
        for k, v in module._parameters.items()
        if v is not None
    ]
    skip = module._non_persistent_buffers_set
    slots += [
        ModuleTensor(name, module, k, True, k not in skip)
        for k, v in module._buffers.items()
        if v is not None
    ]
    return slots


def state_names(model: nn.Module) -> dict[int, list[str]]:
    """Every persistent tensor's state-dict names, by tensor id (a tied weight has several;
    a checkpoint may hold it under any one of them)."""
    names: dict[int, list[str]] = {}
    for name, mod in model.named_modules(remove_duplicate=False):
        for s in module_tensors(name, mod):
            if s.persistent:
                names.setdefault(id(s.get()), []).append(s.key)
    return names


def build_meta_model(build: Callable[[torch.device], nn.Module] | nn.Module) -> nn.Module:
    """Calls the factory on the meta device (or takes a model built there) and checks it."""
    if isinstance(build, nn.Module):
        model = build
    elif callable(build):
        meta = torch.device("meta")
        with meta:  # also catches factories that ignore their device argument
            model = build(meta)
        if not isinstance(model, nn.Module):
            raise ConfigError(
                "build", f"build(device) must return an nn.Module, got {type(model).__name__}"
            )
    else:
        raise ConfigError(
            "build", f"must be build(device) -> nn.Module or a model on meta, got {build!r}"
        )
    for name, mod in model.named_modules():
        for s in module_tensors(name, mod):
            t = s.get()
            if s.persistent and t.device.type != "meta":
                raise ConfigError(
                    "build",
                    f"{s.key} is on {t.device}, not meta: build the model under torch.device('meta') "
                    "so no full-precision copy is made in RAM",
                )
            if not s.persistent and t.device.type == "meta":
                raise ConfigError(
                    "build",
                    f"buffer {s.key} is not saved in checkpoints (persistent=False) and was built on "
                    "meta; create it on the CPU inside build (with torch.device('cpu'): ...)",
                )
    return model


def model_signature(model: nn.Module) -> str:
    """A hash of every state tensor's name, shape and dtype (part of the cache key)."""
    rows = [
        (s.key, list(s.get().shape), str(s.get().dtype))
        for name, mod in model.named_modules()
        for s in module_tensors(name, mod)
        if s.persistent
    ]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:32]


def place(where: ModuleTensor, value: torch.Tensor, requires_grad: bool = False) -> None:
    """Puts ``value`` where the (meta) tensor was: a new Parameter, or the buffer."""
    if where.is_buffer:
        where.module._buffers[where.attr] = value
    else:
        value = value.detach()
        where.module._parameters[where.attr] = nn.Parameter(
            value, requires_grad=requires_grad and value.dtype.is_floating_point
        )


def snapshot(model: nn.Module) -> list[tuple[dict, dict]]:
    """Shallow copies of every module's tensor tables, to undo a half-done load."""
    return [(dict(m._parameters), dict(m._buffers)) for m in model.modules()]


def restore(model: nn.Module, saved: list[tuple[dict, dict]]) -> None:
    for m, (params, buffers) in zip(model.modules(), saved):
        m._parameters.clear()
        m._parameters.update(params)
        m._buffers.clear()
        m._buffers.update(buffers)
