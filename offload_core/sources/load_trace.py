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
conversion) is a new object: it has no source, and ``unsourced`` names it. A tensor subclass
the host built around given tensors (ComfyUI's ``QuantizedTensor`` around fp8 data and its
scales) is traced through its inner tensors (``inner_sources``): each is a given tensor, or a
whole view of one (a dtype view of the same bytes).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_module_registration_hook
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .checkpoint import CheckpointIndex

META = torch.device("meta")


def header_state_dict(
    index: CheckpointIndex, read: Callable[[str], bool] | None = None
) -> dict[str, torch.Tensor]:
    """The file's tensors as a host's loader reads them: float tensors as meta tensors (their
    bytes stay in the file), the others (tokenizer blobs, position ids, quantization configs:
    small) read; ``read(key)``: a float tensor the host reads a value of while it loads (a
    scalar it compares) is read too."""
    sd: dict[str, torch.Tensor] = {}
    with index:
        for key, st in index.entries.items():
            wanted = st.nbytes == 0 or (read is not None and read(key))  # empty: no bytes
            if st.dtype.is_floating_point and not wanted:
                sd[key] = torch.empty(st.shape, dtype=st.dtype, device=META)
            else:
                sd[key] = index.read_stored(st).clone()
    return sd


class LoadTrace:
    """Records, for each module built while it is active, the tensor objects its
    ``load_state_dict`` was given; ``sources`` turns them into each file's key map."""

    def __init__(self, state_dicts: list[dict[str, torch.Tensor]], keep: bool = False) -> None:
        self.state_dicts = state_dicts
        #: keep the tensors given (``given``): a second build of the same network whose
        #: converted values the caller takes (a tensor the host computed from the file's)
        self._kept: dict[int, dict[str, torch.Tensor]] | None = {} if keep else None
        # Every tensor kept alive: their ids key ``_origin`` (the host may pop some).
        self._tensors = [t for sd in state_dicts for t in sd.values()]
        self._origin = {id(t): (i, k) for i, sd in enumerate(state_dicts) for k, t in sd.items()}
        # id(module) -> {a key under the module, as load_state_dict gave it: id(tensor)}
        self._given: dict[int, dict[str, int]] = {}
        self._modules: list[nn.Module] = []  # kept alive: their ids key ``_given``
        self._handles: list[Any] = []
        self._thread = threading.get_ident()
        self._storages: dict[int, tuple[int, str]] | None = None

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
        kept = None if self._kept is None else self._kept.setdefault(id(module), {})
        for key, t in sd.items():
            if key.startswith(prefix) and isinstance(t, torch.Tensor):
                given[key[len(prefix) :]] = id(t)
                if kept is not None:
                    kept[key[len(prefix) :]] = t

    def given(self, net: nn.Module) -> dict[str, torch.Tensor]:
        """The tensor the host gave each of ``net``'s names (a trace made with ``keep``):
        the value its loader copied into it, converted or not."""
        assert self._kept is not None, "a LoadTrace made with keep=True"
        out: dict[str, torch.Tensor] = {}
        for mname, mod in net.named_modules(remove_duplicate=False):
            for rel, t in self._kept.get(id(mod), {}).items():
                out.setdefault(f"{mname}.{rel}" if mname else rel, t)
        return out

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

    def inner_sources(self, net: nn.Module) -> list[dict[str, tuple[str, ...]]]:
        """For each state dict (file), the network's names of the tensor subclasses on meta
        whose every inner tensor holds one of its tensors whole -> those tensors' keys, in
        ``__tensor_flatten__`` order. An inner tensor is known by its storage (the wrapper's
        construction detaches it: a new object on the same storage), else, where the host
        copied it (a scale cloned into the wrapper's parameters), as the one tensor its
        module was given with that shape and element size that nothing else of the module
        holds; a subclass with an inner tensor matched by neither is left out (``unsourced``
        and the caller name it)."""
        out: list[dict[str, tuple[str, ...]]] = [{} for _ in self.state_dicts]
        given: dict[str, int] = {}  # every name given under any module -> the tensor's id
        for mname, mod in net.named_modules(remove_duplicate=False):
            for rel, tid in self._given.get(id(mod), {}).items():
                given.setdefault(f"{mname}.{rel}" if mname else rel, tid)
        for mname, mod in net.named_modules(remove_duplicate=False):
            for attr, t in (*mod._parameters.items(), *mod._buffers.items()):
                if t is None or t.device != META or not is_traceable_wrapper_subclass(t):
                    continue
                names, _ = t.__tensor_flatten__()  # type: ignore[attr-defined]
                inner = [getattr(t, n) for n in names]
                srcs = [self._whole_origin(x) for x in inner]
                if None in srcs:
                    at = f"{mname}." if mname else ""
                    mine = {k[len(at) :]: v for k, v in given.items() if k.startswith(at)}
                    srcs = self._by_shape(mod, attr, mine, inner, srcs)
                files = {s[0] for s in srcs if s is not None}
                if None in srcs or len(files) != 1:
                    continue
                name = f"{mname}.{attr}" if mname else attr
                out[files.pop()][name] = tuple(s[1] for s in srcs if s is not None)
        return out

    def _by_shape(
        self,
        mod: nn.Module,
        attr: str,
        given: dict[str, int],
        inner: list[torch.Tensor],
        srcs: list[tuple[int, str] | None],
    ) -> list[tuple[int, str] | None]:
        """``srcs`` completed from the tensors ``mod`` was given (``given``: by names under
        it, as its parents saw them before it loaded itself; not under a child, not one it
        holds under another name), each inner tensor matched to the only one of its shape
        and element size; None where there is not exactly one."""
        held = {k for k in (*mod._parameters, *mod._buffers) if k != attr}
        used = {s for s in srcs if s is not None}
        free = []
        for rel, tid in given.items():
            src = self._origin.get(tid)
            if "." in rel or rel in held or src is None or src in used:
                continue
            free.append((src, self.state_dicts[src[0]][src[1]]))
        out = list(srcs)
        for i, x in enumerate(inner):
            if out[i] is not None:
                continue
            same = [
                src
                for src, g in free
                if g.device == META
                and tuple(g.shape) == tuple(x.shape)
                and g.element_size() == x.element_size()
                and x.is_contiguous()
                and x.storage_offset() == 0
            ]
            if len(same) == 1:
                out[i] = same[0]
                free = [(s, g) for s, g in free if s != same[0]]
        return out

    def _whole_origin(self, t: torch.Tensor) -> tuple[int, str] | None:
        """The (file, key) whose tensor ``t`` holds whole: the same storage (a detached copy
        of the wrapper or a dtype view of it share it), from its start, every byte of it."""
        src = self._storage_origin().get(_storage_id(t))
        if src is None:
            return None
        given = self.state_dicts[src[0]][src[1]]
        whole = t.storage_offset() == 0 and t.is_contiguous() and t.nbytes == given.nbytes
        return src if whole else None

    def _storage_origin(self) -> dict[int, tuple[int, str]]:
        if self._storages is None:
            self._storages = {
                _storage_id(t): (i, k)
                for i, sd in enumerate(self.state_dicts)
                for k, t in sd.items()
                if t.device == META
            }
        return self._storages


def _storage_id(t: torch.Tensor) -> int:
    """The identity of ``t``'s storage: shared by every view and detached alias of it (each
    meta tensor the file's header makes has one of its own)."""
    return int(t.untyped_storage()._cdata)


def unsourced(net: nn.Module, keys: list[dict[str, str]]) -> list[str]:
    """The network's tensors still on meta that no file gives a value."""
    out = []
    for mname, mod in net.named_modules(remove_duplicate=False):
        for attr, t in (*mod._parameters.items(), *mod._buffers.items()):
            name = f"{mname}.{attr}" if mname else attr
            if t is not None and t.device == META and not any(name in k for k in keys):
                out.append(name)
    return out
