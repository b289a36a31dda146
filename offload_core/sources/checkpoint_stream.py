"""A model's weights as they wait in its safetensors checkpoint: the source of truth.

A model built on the meta device holds no bytes; ``CheckpointWeights`` knows, for each of its
tensors, where the original bytes are in the checkpoint (``origin``) and how to turn them into
what the model computes with (``fill_entry``): read straight into the slab where the stored
bytes are already the model's (same dtype and shape, contiguous, no patch), else read, cast
(``copy_``, as ``load_state_dict`` casts) and passed through ``convert`` (a baked LoRA, ...).
Everything about the file is checked when it is opened, before any weight moves.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ..errors import ConfigError
from ..formats.safetensors import Header, HeaderError, StoredTensor, pread_stored, read_header
from ..model.grouping import GroupSpec
from ..model.layout import Entry
from .reads import CHUNK, Chunk, ReadPlan, bytes_view, open_plan

#: ``convert(qualname, tensor)``: the tensor the model computes with, from the checkpoint's
#: tensor already cast to the model's dtype (may return it unchanged).
Converter = Callable[[str, torch.Tensor], torch.Tensor]


def _open_header(path: str | os.PathLike[str], setting: str) -> Header:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(setting, f"{os.fspath(path)!r} is not a file; choose a .safetensors file")
    try:
        return read_header(p)
    except (HeaderError, OSError) as e:
        raise ConfigError(
            setting, f"{p.name} cannot be read as safetensors ({e}); choose another file"
        ) from None


def _persistent_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every persistent tensor by each of its state-dict names (tied weights: several)."""
    out: dict[str, torch.Tensor] = {}
    for mname, mod in model.named_modules(remove_duplicate=False):
        skip = mod._non_persistent_buffers_set
        items = [
            *mod._parameters.items(),
            *((k, v) for k, v in mod._buffers.items() if k not in skip),
        ]
        for attr, t in items:
            if t is not None:
                out[f"{mname}.{attr}" if mname else attr] = t
    return out


def _castable(stored: torch.dtype, wanted: torch.dtype) -> bool:
    if stored == wanted:
        return True
    return stored.is_floating_point and wanted.is_floating_point


class CheckpointWeights:
    """Where each tensor of a meta-built model waits in its checkpoint, and how to read it."""

    def __init__(
        self,
        header: Header,
        keys: dict[str, str],
        setting: str,
        prefix: str = "",
        convert: Converter | None = None,
        changed: Callable[[str], bool] | None = None,
    ) -> None:
        self.header = header
        self.path = Path(header.path)
        self.keys = keys  # model name -> checkpoint key
        self.prefix = prefix  # the keys' prefix in the file (ComfyUI's model.diffusion_model.)
        self.setting = setting
        self.convert = convert
        self.changed = changed or (lambda name: False)
        self._fd = -1

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
        header = _open_header(path, setting)
        keys: dict[str, str] = {}
        missing, wrong = [], []
        by_id: dict[int, list[str]] = {}
        tensors = _persistent_tensors(model)
        for name, t in tensors.items():
            by_id.setdefault(id(t), []).append(name)
        for names in by_id.values():
            t = tensors[names[0]]
            if t.device.type != "meta":
                continue  # built for real by the model itself
            key = next((prefix + n for n in names if prefix + n in header.entries), None)
            if key is None:
                missing.append(prefix + names[0])
                continue
            st = header.entries[key]
            if st.shape != tuple(t.shape) or not _castable(st.dtype, t.dtype):
                wrong.append(f"{key} {st.dtype} {list(st.shape)} != {t.dtype} {list(t.shape)}")
            keys.update((n, key) for n in names)
        if missing or wrong:
            what = [f"{len(missing)} tensors missing (first: {', '.join(missing[:3])})"] * bool(
                missing
            ) + [f"{len(wrong)} differ (first: {'; '.join(wrong[:3])})"] * bool(wrong)
            raise ConfigError(
                setting,
                f"{Path(header.path).name} does not hold this model's weights: {', '.join(what)}; "
                "choose the file this model was saved as",
            )
        return cls(header, keys, setting, prefix, convert, changed)

    @staticmethod
    def read(path: str | os.PathLike[str], setting: str) -> dict[str, StoredTensor]:
        """The file's tensors by key, checked (a ConfigError naming ``setting``)."""
        return _open_header(path, setting).entries

    def materialize(self, model: nn.Module, device: torch.device | str) -> None:
        """Every meta tensor of ``model`` read whole onto ``device`` (a plain, resident load)."""
        with self:
            real: dict[int, torch.Tensor] = {}
            keep: list[torch.Tensor] = []  # the meta tensors, so no id is reused meanwhile
            for mname, mod in model.named_modules(remove_duplicate=False):
                for table in (mod._parameters, mod._buffers):
                    for attr, t in table.items():
                        if t is None or t.device.type != "meta":
                            continue
                        if id(t) not in real:
                            name = f"{mname}.{attr}" if mname else attr
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
        return None if key is None else self.header.entries[key]

    def verbatim(self, entry: Entry) -> bool:
        """The stored bytes are exactly what the model computes with: read, never converted."""
        st = self.origin(entry.qualname)
        if st is None or entry.subclass is not None or self.changed(entry.qualname):
            return False
        part = entry.parts[0]
        return st.dtype == part.dtype and st.shape == part.size and part.contiguous

    def reads_verbatim(self, entries: list[Entry]) -> bool:
        """Every entry still waits in the file (meta) and is read as stored: a group made of
        them keeps the checkpoint as its disk-tier source, nothing written."""
        return all(e.current().device.type == "meta" and self.verbatim(e) for e in entries)

    # -- reading -----------------------------------------------------------------------------
    def __enter__(self) -> CheckpointWeights:
        self._fd = os.open(self.path, os.O_RDONLY)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _read(self, st: StoredTensor, out: memoryview) -> None:
        try:
            pread_stored(self._fd, st, out, self.path.name)
        except HeaderError:
            raise ConfigError(
                self.setting,
                f"{self.path.name} ended inside {st.key!r} (it was truncated or replaced "
                "while loading); choose a complete file",
            ) from None

    def read_tensor(self, qualname: str, like: torch.Tensor) -> torch.Tensor:
        """A new CPU tensor shaped and typed like ``like``: the stored tensor, cast, converted."""
        st = self.origin(qualname)
        assert st is not None, qualname
        raw = torch.empty(st.nbytes, dtype=torch.uint8)
        self._read(st, bytes_view(raw))
        stored = raw.view(st.dtype).view(st.shape)
        if is_traceable_wrapper_subclass(like):  # planned quantized: converted below
            like = torch.empty(like.shape, dtype=like.dtype, device="meta")
        out = stored if st.dtype == like.dtype else torch.empty_like(like, device="cpu")
        if out is not stored:
            out.copy_(stored)  # load_state_dict's cast: bit-equal to ComfyUI's loaders
        return self._converted(qualname, out)

    def _converted(self, qualname: str, t: torch.Tensor) -> torch.Tensor:
        if self.convert is None or not self.changed(qualname):
            return t
        return self.convert(qualname, t)

    def fill_entry(self, entry: Entry, buf: torch.Tensor) -> bool:
        """Puts the entry's tensor at its place in ``buf``; True when read verbatim."""
        part = entry.parts[0]
        st = self.origin(entry.qualname)
        if st is not None and self.verbatim(entry):
            self._read(st, bytes_view(buf[part.offset : part.offset + part.nbytes]))
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
            elif e.subclass is not None and not self.changed(e.qualname):
                raise ConfigError(self.setting, f"{e.qualname} is a tensor subclass on meta")
            else:
                verbatim = self.fill_entry(e, buf) and verbatim
        return verbatim


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


def plan_from_read(
    path: Path,
    spec: GroupSpec,
    packed: torch.Tensor,
    weights: CheckpointWeights,
    direct: bool = True,
) -> ReadPlan:
    """A checked read plan for a group whose slab ``packed`` was just read verbatim from the
    checkpoint: the CRCs come from those bytes (the file is read once, not twice)."""
    chunks = []
    for e in spec.entries:
        st = weights.origin(e.qualname)
        assert st is not None
        part = e.parts[0]
        for o in range(0, part.nbytes, CHUNK):
            n = min(CHUNK, part.nbytes - o)
            crc = zlib.crc32(bytes_view(packed[part.offset + o : part.offset + o + n]))
            chunks.append(Chunk(st.start + o, part.offset + o, n, crc))
    plan = open_plan(path, chunks, owned=False, direct=direct)
    plan.verified = True
    return plan
