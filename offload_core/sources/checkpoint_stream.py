"""A meta-built model's weights as they wait in its checkpoint: the source of truth.

A model built on the meta device holds no bytes; ``CheckpointWeights`` matches each of its
tensors to the checkpoint (through the file's ``CheckpointIndex``) and turns the stored bytes
into what the model computes with (``fill_entry``): read straight into the slab where they
are already the model's (``Stored.VERBATIM``), else read, cast (``copy_``, as
``load_state_dict`` casts) and passed through ``convert`` (a baked LoRA, a quantization:
``Stored.CONVERTED``). Everything about the file is checked when it is opened, before any
weight moves.

A tensor subclass the host's loader built around stored tensors (ComfyUI's ``QuantizedTensor``:
fp8 data, its scale, NVFP4/MXFP8 block scales) has one file key per inner tensor (``parts``):
each inner tensor is read verbatim into its place in the slab, and the subclass is rebuilt
around them (``Entry.build``), as the host's loader built it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import ExitStack
from types import TracebackType

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ..disk.plan import ReadPlan
from ..errors import ConfigError
from ..formats.safetensors import StoredTensor, byte_view
from ..model.grouping import GroupSpec
from ..model.layout import Entry
from .checkpoint import CheckpointIndex, Stored

#: ``convert(qualname, tensor)``: the tensor the model computes with, from the checkpoint's
#: tensor already cast to the model's dtype (may return it unchanged).
Converter = Callable[[str, torch.Tensor], torch.Tensor]


class CheckpointWeights:
    """Where each tensor of a meta-built model waits in its checkpoint, and how to read it."""

    def __init__(
        self,
        index: CheckpointIndex,
        keys: dict[str, str],
        prefix: str = "",
        convert: Converter | None = None,
        changed: Callable[[str], bool] | None = None,
        parts: dict[str, tuple[str, ...]] | None = None,
    ) -> None:
        self.index = index
        self.path = index.path
        self.keys = keys  # model name -> checkpoint key
        self.prefix = prefix  # the keys' prefix in the file (ComfyUI's model.diffusion_model.)
        self.setting = index.setting
        self.convert = convert
        self.changed = changed or (lambda name: False)
        #: model name of a tensor subclass -> the file key of each inner tensor, in the order
        #: of its ``__tensor_flatten__`` names (each stored as the subclass holds it)
        self.parts = parts or {}

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        model: nn.Module,
        *,
        prefix: str = "",
        setting: str = "checkpoint",
        convert: Converter | None = None,
        changed: Callable[[str], bool] | None = None,
    ) -> CheckpointWeights:
        """Checks that every meta tensor of ``model`` is in the file (under ``prefix``) with
        its shape and a dtype that casts to the model's; a ConfigError names ``setting``."""
        index = CheckpointIndex.open(path, setting)
        return cls(index, index.match(model, prefix), prefix, convert, changed)

    def materialize(
        self,
        model: nn.Module,
        device: torch.device | str,
        only: Callable[[str], bool] | None = None,
    ) -> None:
        """Every meta tensor of ``model`` read whole onto ``device`` (a plain, resident load);
        with ``only``, the tensors whose qualified names it accepts (a model whose tensors
        are spread over several files reads each file's own)."""
        with self:
            real: dict[int, torch.Tensor] = {}
            keep: list[torch.Tensor] = []  # the meta tensors, so no id is reused meanwhile
            for mname, mod in model.named_modules(remove_duplicate=False):
                for table in (mod._parameters, mod._buffers):
                    for attr, t in table.items():
                        name = f"{mname}.{attr}" if mname else attr
                        if t is None or t.device.type != "meta" or (only and not only(name)):
                            continue
                        if id(t) not in real:
                            value = self.read_tensor(name, t).to(device)
                            if isinstance(t, nn.Parameter):
                                grad = t.requires_grad and value.dtype.is_floating_point
                                value = nn.Parameter(value, requires_grad=grad)
                            real[id(t)] = value
                            keep.append(t)
                        table[attr] = real[id(t)]  # type: ignore[assignment]

    # -- where the bytes are -----------------------------------------------------------------
    def origin(self, qualname: str) -> StoredTensor | None:
        """The checkpoint entry holding ``qualname``'s original bytes (None: not stored)."""
        key = self.keys.get(qualname)
        return None if key is None else self.index.entries[key]

    def stored(self, entry: Entry) -> Stored | None:
        """How the entry's tensor is had from the file (None: it is not in it)."""
        if entry.qualname in self.parts:
            if self.changed(entry.qualname):
                return Stored.CONVERTED
            return Stored.VERBATIM if self._parts_verbatim(entry) else None
        key = self.keys.get(entry.qualname)
        if key is None:
            return None
        if entry.subclass is not None or self.changed(entry.qualname):
            return Stored.CONVERTED
        return self.index.stored(key, entry)

    def reads_verbatim(self, entries: list[Entry]) -> bool:
        """Every entry still waits in the file (meta) and is read as stored: a group made of
        them keeps the checkpoint as its disk-tier source, nothing written."""
        return all(
            e.current().device.type == "meta" and self.stored(e) is Stored.VERBATIM for e in entries
        )

    def _parts_verbatim(self, entry: Entry) -> bool:
        """Each inner tensor's bytes are its stored tensor's, as they are (a dtype view of the
        same bytes included: core views uint8 block scales as float8)."""
        keys = self.parts[entry.qualname]
        if len(keys) != len(entry.parts):
            return False
        for key, part in zip(keys, entry.parts):
            st = self.index.entries.get(key)
            if st is None or st.nbytes != part.nbytes or not part.contiguous:
                return False
            if st.start % part.dtype.itemsize:
                return False
        return True

    def spans(self, spec: GroupSpec) -> list[tuple[str, int, int]]:
        """(file key, offset in the slab, bytes) of every stored tensor of a verbatim group:
        one per plain tensor, one per inner tensor of a subclass."""
        out = []
        for e in spec.entries:
            keys = self.parts.get(e.qualname) or (self.keys[e.qualname],)
            out += [(k, p.offset, p.nbytes) for k, p in zip(keys, e.parts)]
        return out

    def read_plan(self, spec: GroupSpec, packed: torch.Tensor, direct: bool) -> ReadPlan:
        """The plan of reading a verbatim group from the file into its slab ``packed``."""
        return self.index.read_plan_spans(self.spans(spec), packed, direct)

    @property
    def name(self) -> str:
        """The file's name, as errors and notes say it."""
        return self.path.name

    # -- reading -----------------------------------------------------------------------------
    def __enter__(self) -> CheckpointWeights:
        self.index.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.index.__exit__(kind, e, tb)

    def read_tensor(self, qualname: str, like: torch.Tensor) -> torch.Tensor:
        """A new CPU tensor shaped and typed like ``like``: the stored tensor, cast, converted."""
        if qualname in self.parts:
            return self._converted(qualname, self._read_parts(qualname, like))
        st = self.origin(qualname)
        assert st is not None, qualname
        stored = self.index.read_stored(st)
        if is_traceable_wrapper_subclass(like):  # planned quantized: converted below
            like = torch.empty(like.shape, dtype=like.dtype, device="meta")
        out = stored if st.dtype == like.dtype else torch.empty_like(like, device="cpu")
        if out is not stored:
            out.copy_(stored)  # load_state_dict's cast: bit-equal to ComfyUI's loaders
        return self._converted(qualname, out)

    def _read_parts(self, qualname: str, like: torch.Tensor) -> torch.Tensor:
        """The subclass ``like`` (on meta) rebuilt around its inner tensors read as stored."""
        names, ctx = like.__tensor_flatten__()  # type: ignore[attr-defined]
        inner = {}
        for name, key in zip(names, self.parts[qualname]):
            want = getattr(like, name)
            stored = self.index.read_stored(self.index.entries[key])
            inner[name] = stored.reshape(-1).view(want.dtype).view(want.shape)
        return type(like).__tensor_unflatten__(  # type: ignore[attr-defined, no-any-return]
            inner, ctx, like.size(), like.stride()
        )

    def _converted(self, qualname: str, t: torch.Tensor) -> torch.Tensor:
        if self.convert is None or not self.changed(qualname):
            return t
        return self.convert(qualname, t)

    def fill_entry(self, entry: Entry, buf: torch.Tensor) -> bool:
        """Puts the entry's tensor at its place in ``buf``; True when read verbatim."""
        part = entry.parts[0]
        if entry.qualname in self.parts and self.stored(entry) is Stored.VERBATIM:
            for key, p in zip(self.parts[entry.qualname], entry.parts):
                view = byte_view(buf[p.offset : p.offset + p.nbytes])
                self.index.read_into(self.index.entries[key], view)
            return True
        st = self.origin(entry.qualname)
        if st is not None and self.stored(entry) is Stored.VERBATIM:
            self.index.read_into(st, byte_view(buf[part.offset : part.offset + part.nbytes]))
            return True
        if entry.subclass is None:
            like = torch.empty_strided(part.size, part.stride, dtype=part.dtype, device="meta")
        else:  # quantized as it streams: read_tensor reads its plain form, then converts
            like = entry.current()
        value = self.read_tensor(entry.qualname, like)
        _check_layout(entry, value, self.setting)
        entry.fill(buf, value)
        return False

    def fill_group(self, spec: GroupSpec, buf: torch.Tensor) -> bool:
        """Fills a group's slab from the file (a tensor the model built itself from its own
        value); True when every tensor was read verbatim (the file can be its source)."""
        verbatim = True
        for e in spec.entries:
            current = e.current()
            if current.device.type != "meta":
                e.fill(buf, current)
                verbatim = False
            elif (
                e.subclass is not None
                and not self.changed(e.qualname)
                and e.qualname not in self.parts
            ):
                raise ConfigError(self.setting, f"{e.qualname} is a tensor subclass on meta")
            else:
                verbatim = self.fill_entry(e, buf) and verbatim
        return verbatim


class CheckpointSet(CheckpointWeights):
    """Several files' weights as one model's source (a CLIP whose encoders each wait in their
    own file): every tensor is read from the file that holds it, and a group whose tensors are
    all one file's, read verbatim, keeps that file as its disk-tier source."""

    def __init__(
        self,
        members: list[CheckpointWeights],
        convert: Converter | None = None,
        changed: Callable[[str], bool] | None = None,
    ) -> None:
        if not members:
            raise ValueError("a CheckpointSet needs at least one file")
        keys = {k: v for m in members for k, v in m.keys.items()}
        parts = {k: v for m in members for k, v in m.parts.items()}
        super().__init__(members[0].index, keys, "", convert, changed, parts)
        self.members = [
            CheckpointWeights(m.index, m.keys, m.prefix, convert, changed, m.parts) for m in members
        ]
        self._member = {q: m for m in self.members for q in (*m.keys, *m.parts)}
        self._open = ExitStack()

    def _of(self, qualname: str) -> CheckpointWeights:
        return self._member[qualname]

    @property
    def name(self) -> str:
        return ", ".join(m.path.name for m in self.members)

    def origin(self, qualname: str) -> StoredTensor | None:
        m = self._member.get(qualname)
        return None if m is None else m.origin(qualname)

    def stored(self, entry: Entry) -> Stored | None:
        m = self._member.get(entry.qualname)
        return None if m is None else m.stored(entry)

    def reads_verbatim(self, entries: list[Entry]) -> bool:
        one_file = len({id(self._member.get(e.qualname)) for e in entries}) == 1
        return one_file and super().reads_verbatim(entries)

    def spans(self, spec: GroupSpec) -> list[tuple[str, int, int]]:
        return self._of(spec.entries[0].qualname).spans(spec)

    def read_plan(self, spec: GroupSpec, packed: torch.Tensor, direct: bool) -> ReadPlan:
        return self._of(spec.entries[0].qualname).read_plan(spec, packed, direct)

    def __enter__(self) -> CheckpointSet:
        for m in self.members:
            self._open.enter_context(m)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._open.close()

    def read_tensor(self, qualname: str, like: torch.Tensor) -> torch.Tensor:
        return self._of(qualname).read_tensor(qualname, like)

    def fill_entry(self, entry: Entry, buf: torch.Tensor) -> bool:
        return self._of(entry.qualname).fill_entry(entry, buf)


def _check_layout(entry: Entry, value: torch.Tensor, setting: str) -> None:
    """``value`` has the layout the plan gave ``entry`` (the same subclass, inner tensors,
    shapes, dtypes and ctx): a conversion that changed it would be copied into the wrong
    bytes, so it is refused instead."""
    same = (
        type(value) is entry.subclass
        if entry.subclass is not None
        else not (is_traceable_wrapper_subclass(value))
    )
    if same and entry.subclass is not None:
        names, ctx = value.__tensor_flatten__()  # type: ignore[attr-defined]
        same = tuple(names) == entry.inner_names and _equal_ctx(ctx, entry.ctx)
    inner = entry.inner_tensors(value) if same else []
    same = same and all(
        tuple(t.shape) == p.size and t.dtype == p.dtype for t, p in zip(inner, entry.parts)
    )
    if not same:
        raise ConfigError(
            setting,
            f"{entry.qualname}: converting it gave a {type(value).__name__} laid out unlike "
            "the plan (a quantization that declined this weight?); skip this layer",
        )


def _equal_ctx(a: object, b: object) -> bool:
    try:
        return bool(a == b)
    except (RuntimeError, TypeError, ValueError):  # a ctx holding tensors: compare by repr
        return repr(a) == repr(b)
