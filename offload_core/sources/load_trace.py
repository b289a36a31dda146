"""Which checkpoint tensor a host's loader gave each tensor of a network, seen rather than
guessed: for a host that builds the network and routes a state dict into it with its own key
renames (ComfyUI's text encoders: each file to its encoder, ``transformer.`` and other prefixes
added or stripped, keys renamed), so a network built on the meta device knows where each of
its weights waits.

The state dicts are made from the files' headers (``header_state_dict``: meta tensors, no
bytes read but those of small non-float tensors such as a tokenizer blob the host reads while
it builds), and every tensor is known by its identity. While ``LoadTrace`` is active every
module registered (``register_module_module_registration_hook``, this thread only) gets a
``load_state_dict`` pre-hook that records the tensor object the host passes under each key of
its subtree (so a layer that loads itself its own way is seen from its parent). A tensor the host replaced on the way (a transpose, a dtype or format
conversion) is a new object: it has no source, and ``unsourced`` names it.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_module_registration_hook

from .checkpoint import CheckpointIndex

META = torch.device("meta")


def header_state_dict(index: CheckpointIndex) -> dict[str, torch.Tensor]:
    """The file's tensors as a host's loader reads them: float tensors as meta tensors (their
    bytes stay in the file), the others (tokenizer blobs, position ids: small) read."""
    sd: dict[str, torch.Tensor] = {}
    with index:
        for key, st in index.entries.items():
            if st.dtype.is_floating_point:
                sd[key] = torch.empty(st.shape, dtype=st.dtype, device=META)
            else:
                sd[key] = index.read_stored(st).clone()
    return sd


class LoadTrace:
    """Records, for each module built while it is active, the tensor objects its
    ``load_state_dict`` was given; ``sources`` turns them into each file's key map."""

    def __init__(self, state_dicts: list[dict[str, torch.Tensor]]) -> None:
        self.state_dicts = state_dicts
        # Every tensor kept alive: their ids key ``_origin`` (the host may pop some).
        self._tensors = [t for sd in state_dicts for t in sd.values()]
        self._origin = {id(t): (i, k) for i, sd in enumerate(state_dicts) for k, t in sd.items()}
        # id(module) -> {a key under the module, as load_state_dict gave it: id(tensor)}
        self._given: dict[int, dict[str, int]] = {}
        self._modules: list[nn.Module] = []  # kept alive: their ids key ``_given``
        self._handles: list[Any] = []
        self._thread = threading.get_ident()

    def __enter__(self) -> LoadTrace:
        self._handles.append(register_module_module_registration_hook(self._registered))  # type: ignore[arg-type]
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _registered(self, parent: nn.Module, name: str, child: nn.Module | None) -> None:
        if child is None or threading.get_ident() != self._thread:
            return
        self._modules.append(child)
        self._handles.append(child.register_load_state_dict_pre_hook(self._pre_hook))

    def _pre_hook(self, module: nn.Module, sd: dict[str, Any], prefix: str, *args: Any) -> None:
        # A module's pre-hook sees the keys of its whole subtree: a layer that loads itself
        # its own way (ComfyUI's lazily built Linears under dynamic VRAM override
        # _load_from_state_dict and skip their hooks) is still seen from its parent.
        given = self._given.setdefault(id(module), {})
        for key, t in sd.items():
            if key.startswith(prefix) and isinstance(t, torch.Tensor):
                given[key[len(prefix) :]] = id(t)

    def sources(self, net: nn.Module) -> list[dict[str, str]]:
        """For each state dict (file), the network's names (under every tied name) of the
        tensors the host gave from it -> their keys."""
        held = {n for n, _ in net.named_parameters(remove_duplicate=False)}
        held |= {n for n, _ in net.named_buffers(remove_duplicate=False)}
        keys: list[dict[str, str]] = [{} for _ in self.state_dicts]
        for mname, mod in net.named_modules(remove_duplicate=False):
            for rel, tid in self._given.get(id(mod), {}).items():
                name = f"{mname}.{rel}" if mname else rel
                src = self._origin.get(tid)
                if src is not None and name in held:
                    keys[src[0]][name] = src[1]
        return keys


def unsourced(net: nn.Module, keys: list[dict[str, str]]) -> list[str]:
    """The network's tensors still on meta that no file gives a value."""
    out = []
    for mname, mod in net.named_modules(remove_duplicate=False):
        for attr, t in (*mod._parameters.items(), *mod._buffers.items()):
            name = f"{mname}.{attr}" if mname else attr
            if t is not None and t.device == META and not any(name in k for k in keys):
                out.append(name)
    return out
