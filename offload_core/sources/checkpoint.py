"""The checkpoint index: the one object that knows a user's safetensors checkpoint.

Opening it (one error, naming the setting that chose the file), its keys and the prefix the
model's names have in it, where each tensor's bytes are, how a stored tensor stands against
the one the model holds (``Stored``), the chunk lists and read plans of a group read from it,
and tensor reads. The placement, the checkpoint origin, repair, the node's free-space check
(through ``CheckpointWeights``) and quant's loader all ask it.

A tensor is read verbatim only where the stored bytes are exactly what the model computes
with (same dtype and shape, a contiguous layout, an offset its dtype can be viewed at); the
bytes land at the slab's 64-byte-aligned offsets, never used at the file's own offsets:
weights at 8-byte-aligned addresses give different results.
"""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from types import TracebackType

import torch
from torch import nn

from ..disk.files import FileBackend, files
from ..disk.plan import ReadPlan, checksummed, open_plan
from ..disk.reader import read_chunk, read_stored, read_stored_new
from ..errors import ConfigError, FerryError
from ..formats.safetensors import Header, StoredTensor, byte_view, read_checkpoint_header
from ..model.layout import Entry


class Stored(Enum):
    """How a checkpoint's tensor stands against the tensor the model computes with."""

    #: The bytes are the model's: read straight into the slab, and the file can be the
    #: group's disk-tier source.
    VERBATIM = "verbatim"
    #: Same shape, a dtype ``copy_`` casts to the model's, as ``load_state_dict`` casts.
    CAST = "cast"
    #: Read, cast, then passed through a converter (a baked LoRA, a quantization):
    #: ``CheckpointWeights`` says which.
    CONVERTED = "converted"


def castable(stored: torch.dtype, wanted: torch.dtype) -> bool:
    """Whether a stored dtype may stand for the model's (a float for a float)."""
    return stored == wanted or (stored.is_floating_point and wanted.is_floating_point)


class CheckpointIndex:
    """A safetensors checkpoint, checked when opened; a context manager keeps it open for
    reads (re-entrant)."""

    def __init__(self, header: Header, setting: str) -> None:
        self.header = header
        self.setting = setting  # names the file in every error ("checkpoint", ...)
        self.path = Path(header.path)
        self._fd = -1
        self._files: FileBackend = files()
        self._depth = 0

    @classmethod
    def open(cls, path: str | os.PathLike[str], setting: str) -> CheckpointIndex:
        """The file's index; a ConfigError naming ``setting`` if it is not a readable
        safetensors file."""
        return cls(read_checkpoint_header(path, setting), setting)

    @property
    def entries(self) -> dict[str, StoredTensor]:
        return self.header.entries

    # -- the model against the file ----------------------------------------------------------
    def prefix_for(self, names: list[str]) -> str | None:
        """The key prefix under which the model's tensor names appear in the checkpoint
        (ComfyUI checkpoints use e.g. ``model.diffusion_model.``); None: none of them."""
        if not names:
            return None
        probe = names[0]
        for key in self.entries:
            if key.endswith(probe):
                prefix = key[: len(key) - len(probe)]
                if prefix == "" or prefix.endswith("."):
                    return prefix
        return None

    def keys_for(self, names: list[str]) -> dict[str, str]:
        """The key of each of ``names`` the file holds: under the file's prefix
        (``prefix_for``), or, where the model's names carry a prefix of their own (a CLIP's
        ``clip_l.transformer.`` before the file's ``text_model.``), without it. Found by
        name alone: the caller checks shapes, dtypes and bytes."""
        prefix = self.prefix_for(names)
        if prefix is not None:
            return {n: prefix + n for n in names if prefix + n in self.entries}
        for probe in names:
            parts = probe.split(".")
            for i in range(1, len(parts)):
                tail = ".".join(parts[i:])
                if tail in self.entries:
                    head = len(probe) - len(tail)
                    own = probe[:head]
                    return {
                        n: n[head:] for n in names if n.startswith(own) and n[head:] in self.entries
                    }
        return {}

    def match(self, model: nn.Module, prefix: str = "") -> dict[str, str]:
        """The key of every persistent meta tensor of ``model`` (by each of its state-dict
        names), checked: each is in the file under ``prefix`` with its shape and a dtype
        that casts to the model's. A ConfigError naming the setting lists what is not."""
        keys: dict[str, str] = {}
        missing, shapes, dtypes = [], [], []
        for names, t in _persistent_tensors(model):
            if t.device.type != "meta":
                continue  # built for real by the model itself
            key = next((prefix + n for n in names if prefix + n in self.entries), None)
            if key is None:
                missing.append(prefix + names[0])
                continue
            st = self.entries[key]
            if st.shape != tuple(t.shape):
                shapes.append(f"{key} {list(st.shape)} != model {list(t.shape)}")
            elif not castable(st.dtype, t.dtype):
                dtypes.append(f"{key} {st.dtype} != model {t.dtype}")
            keys.update((n, key) for n in names)
        problems = [
            f"{len(found)} {what} (first: {'; '.join(found[:3])})"
            for found, what in (
                (missing, "tensors missing"),
                (shapes, "shapes differ"),
                (dtypes, "dtypes do not cast"),
            )
            if found
        ]
        if problems:
            raise ConfigError(
                self.setting,
                f"{self.path.name} does not hold this model's weights: {', '.join(problems)}; "
                "choose the file this model was saved as",
            )
        return keys

    def stored(self, key: str, entry: Entry) -> Stored | None:
        """How the tensor under ``key`` stands against ``entry``'s (VERBATIM or CAST);
        None where it cannot stand for it (absent, another shape, a tensor subclass, a
        dtype that does not cast)."""
        st = self.entries.get(key)
        part = entry.parts[0]
        if st is None or entry.subclass is not None or st.shape != part.size:
            return None
        if not castable(st.dtype, part.dtype):
            return None
        if st.dtype == part.dtype and part.contiguous and st.start % part.dtype.itemsize == 0:
            return Stored.VERBATIM
        return Stored.CAST

    # -- a group read from the file ------------------------------------------------------------
    def read_plan(
        self, keys: list[str], entries: list[Entry], packed: torch.Tensor, direct: bool
    ) -> ReadPlan:
        """The checked plan of reading a verbatim group (its tensors under ``keys``) from the
        file into its slab; the CRC32s are those of ``packed``, the slab as the model holds
        it. ``direct``: with an O_DIRECT descriptor beside ([Note: the window read])."""
        return self.read_plan_spans(
            [(k, e.parts[0].offset, e.parts[0].nbytes) for k, e in zip(keys, entries)],
            packed,
            direct,
        )

    def read_plan_spans(
        self, spans: list[tuple[str, int, int]], packed: torch.Tensor, direct: bool
    ) -> ReadPlan:
        """``read_plan`` from (key, offset in the slab, bytes) spans: a tensor subclass's
        inner tensors are each a span of their own."""
        at = [(self.entries[k].start, off, n) for k, off, n in spans]
        return open_plan(self.path, checksummed(at, byte_view(packed)), False, direct)

    def read_plan_if_same(
        self, keys: list[str], entries: list[Entry], packed: torch.Tensor, direct: bool
    ) -> ReadPlan | None:
        """``read_plan``, if the file's bytes are ``packed``'s (read and compared once,
        now); None where the weights differ from the file's."""
        spans = [(k, e.parts[0].offset, e.parts[0].nbytes) for k, e in zip(keys, entries)]
        return self.read_plan_spans_if_same(spans, packed, direct)

    def read_plan_spans_if_same(
        self, spans: list[tuple[str, int, int]], packed: torch.Tensor, direct: bool
    ) -> ReadPlan | None:
        """``read_plan_spans``, if the file's bytes are ``packed``'s (read and compared
        once, now); None where the weights differ from the file's."""
        plan = self.read_plan_spans(spans, packed, direct)
        check = torch.empty_like(packed)
        try:
            for c in plan.chunks:
                read_chunk(plan, c, check)  # raises on a mismatch: the weights changed
        except FerryError:
            plan.close()
            return None
        plan.verified = True
        return plan

    # -- tensor reads (inside ``with index:``) ---------------------------------------------------
    def __enter__(self) -> CheckpointIndex:
        if self._depth == 0:
            self._files = files()  # the platform's calls, for this opening's reads
            self._fd = self._files.open(self.path)
        self._depth += 1
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._depth -= 1
        if self._depth == 0:
            os.close(self._fd)
            self._fd = -1

    def read_into(self, st: StoredTensor, out: memoryview) -> None:
        """The stored bytes of ``st`` into ``out`` (at least ``st.nbytes`` long)."""
        assert self._fd >= 0, "read inside `with index:`"
        if not read_stored(self._files, self._fd, st, out):
            raise self._ended_inside(st)

    def read_stored(self, st: StoredTensor) -> torch.Tensor:
        """A new CPU tensor holding ``st`` as stored (its dtype and shape)."""
        assert self._fd >= 0, "read inside `with index:`"
        t = read_stored_new(self._files, self._fd, st)
        if t is None:
            raise self._ended_inside(st)
        return t

    def _ended_inside(self, st: StoredTensor) -> ConfigError:
        return ConfigError(
            self.setting,
            f"{self.path.name} ended inside {st.key!r} (it was truncated or replaced "
            "while loading); choose a complete file",
        )


def _persistent_tensors(model: nn.Module) -> list[tuple[list[str], torch.Tensor]]:
    """Every persistent tensor once, with each of its state-dict names (tied: several)."""
    by_id: dict[int, tuple[list[str], torch.Tensor]] = {}
    for mname, mod in model.named_modules(remove_duplicate=False):
        skip = mod._non_persistent_buffers_set
        items = [
            *mod._parameters.items(),
            *((k, v) for k, v in mod._buffers.items() if k not in skip),
        ]
        for attr, t in items:
            if t is not None:
                name = f"{mname}.{attr}" if mname else attr
                by_id.setdefault(id(t), ([], t))[0].append(name)
    return list(by_id.values())
