"""Where a placement's bytes come from: the strategy ``Placement`` is given.

- ``ModelOrigin``: the model's own tensors, already in memory (``apply_offload``), with the
  user's checkpoint beside them: on the disk tier, the file whose mapping the tensors still
  are (a host loader's, found by backing_file.py) or else the one
  ``DiskTier(source_checkpoint=...)`` names: groups whose bytes are the file's are read from
  it (compared once, at apply), and a damaged group file is rewritten from it.
- ``CheckpointOrigin`` (checkpoint_origin.py): a meta-built model whose tensors wait in its
  checkpoint (``load_offloaded``).
The placement asks an origin five things: which groups will be read from the checkpoint
(before anything moves, to size the folder), to fill a group's slab, the read plan of a group
read from the checkpoint, the group's source of truth for repair, and the tensors outside the
groups (placed on the device and put back).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from ..disk.plan import ReadPlan
from ..formats.safetensors import byte_view
from ..model.grouping import GroupSpec
from ..model.layout import Entry, Part
from ..model.plan import OffloadPlan
from ..policy import DiskTier
from .backing_file import backing_files
from .checkpoint import CheckpointIndex, Stored

log = logging.getLogger("ferry")


class Origin(Protocol):
    def opened(self, plan: OffloadPlan, notes: list[str]) -> AbstractContextManager[object]:
        """Prepares (reads the checkpoint's index) and keeps what it reads open while the
        groups are placed; a note says what it decided."""
        ...

    def verbatim(self, entries: list[Entry]) -> bool:
        """Before anything moves: the group will be read from the checkpoint as it is
        stored (nothing written for it)."""
        ...

    def fill(self, spec: GroupSpec, buf: torch.Tensor) -> bool:
        """Puts the group's bytes in ``buf``; True when they are the checkpoint's, verbatim."""
        ...

    def read_plan(
        self, spec: GroupSpec, packed: torch.Tensor, verbatim: bool, direct: bool
    ) -> ReadPlan | None:
        """The plan of reading the group (``packed``: its slab) from the checkpoint; None
        where the checkpoint cannot be its source."""
        ...

    def has_truth(self, spec: GroupSpec) -> bool:
        """Whether the group's bytes can be had again from somewhere other than its source."""
        ...

    def refill(self, spec: GroupSpec, buf: torch.Tensor) -> None:
        """The group's slab as laid out, from the source of truth (``has_truth``)."""
        ...

    def truth_name(self) -> str: ...

    def place_outside(self, model: nn.Module, plan: OffloadPlan) -> None:
        """Before the tensors outside the groups move to the onload device."""
        ...

    def restore_outside(self) -> None:
        """After they moved back: what ``place_outside`` did, undone."""
        ...


#: A group's bytes in one file: the file and, per inner tensor, (key, offset in the slab, bytes).
Spans = tuple[CheckpointIndex, list[tuple[str, int, int]]]


class ModelOrigin:
    """The model's own tensors (and the file they came from: the one their pages still are,
    found by ``backing_files``, or the one ``source_checkpoint`` names)."""

    def __init__(self) -> None:
        self.index: CheckpointIndex | None = None
        #: ``source_checkpoint``'s key of each tensor it holds by name (qualname -> key).
        self.by_name: dict[str, str] = {}
        #: Each inner tensor that is still its checkpoint's stored tensor, in its mapping
        #: ("qualname#part" -> the file and key): read in place, nothing written.
        self.in_place: dict[str, tuple[CheckpointIndex, str]] = {}
        self._read = self._offered = 0  # streamed groups read from the file, of those offered

    def opened(self, plan: OffloadPlan, notes: list[str]) -> AbstractContextManager[object]:
        tier = plan.policy.tier
        if not isinstance(tier, DiskTier):
            return nullcontext()
        groups = plan.grouping.groups
        found = backing_files(
            (_part_name(e, i), t)
            for g in groups
            for e in g.entries
            for i, t in enumerate(e.inner_tensors(e.current()))
        )
        notes.extend(found.notes)
        # Where the loader left the weights in their file's pages: a tensor that is not (a LoRA
        # baked in, a dtype cast) changed, or was copied (its bytes are compared by name).
        self.in_place = found.keys
        if tier.source_checkpoint:
            index = CheckpointIndex.open(Path(tier.source_checkpoint), "source_checkpoint")
            by_name = index.keys_for([e.qualname for g in groups for e in g.entries])
            if not by_name:
                notes.append(
                    f"source_checkpoint {index.path.name} holds none of the model's tensors: "
                    "groups are written"
                )
            else:
                self.index, self.by_name = index, by_name
        return self._saying_what_was_read(notes)

    @contextmanager
    def _saying_what_was_read(self, notes: list[str]) -> Iterator[None]:
        """Once the groups are placed: which file they were read from in place, how many."""
        self._read, self._offered = 0, 0
        yield
        if self._offered and (self.in_place or self.index is not None):
            notes.append(
                f"read in place from {self._file_names()}: {self._read} of {self._offered} "
                f"streamed groups (nothing written for them); {self._offered - self._read} "
                "written (changed since loaded, or not the file's tensors as stored)"
            )
            log.info("ferry: %s", notes[-1])

    def _file_names(self) -> str:
        paths = {str(i.path) for i, _ in self.in_place.values()}
        if self.index is not None:
            paths.add(str(self.index.path))
        return ", ".join(sorted(paths)) or "nowhere"

    def _spans(self, entries: list[Entry]) -> Spans | None:
        """Where the group's bytes are in one file, as stored; None where they are not. Each
        inner tensor by the mapping it still is, else (a plain tensor) by its name in
        ``source_checkpoint``."""
        index: CheckpointIndex | None = None
        spans = []
        for e in entries:
            first: tuple[CheckpointIndex, str] | None = None
            for i, part in enumerate(e.parts):
                got = self.in_place.get(_part_name(e, i)) or self._by_name(e, i)
                if got is None and first is not None:
                    got = _beside(first, part)
                if got is None or (index is not None and got[0].path != index.path):
                    return None
                first = first or got
                index, key = index or got[0], got[1]
                st = index.entries[key]
                if not part.contiguous or st.start % part.dtype.itemsize:
                    return None
                spans.append((key, part.offset, part.nbytes))
        return None if index is None else (index, spans)

    def _by_name(self, e: Entry, i: int = 0) -> tuple[CheckpointIndex, str] | None:
        """``source_checkpoint``'s key of the entry's part ``i`` by the entry's name: a plain
        tensor stored as it is held, or a quantized weight's data (its first part) stored
        with its dtype and shape (its scale: ``_beside``)."""
        key = self.by_name.get(e.qualname)
        index = self.index
        if index is None or key is None:
            return None
        if e.subclass is None:
            return (index, key) if index.stored(key, e) == Stored.VERBATIM else None
        st, part = index.entries[key], e.parts[i]
        return (index, key) if i == 0 and (st.dtype, st.shape) == (part.dtype, part.size) else None

    def _keys(self, entries: list[Entry]) -> list[str]:
        return [self.by_name.get(e.qualname, "") for e in entries]

    def _all(self, entries: list[Entry], ok: tuple[Stored, ...]) -> bool:
        """Every tensor of the group is in ``source_checkpoint`` by name, standing as ``ok``."""
        index = self.index
        return index is not None and all(
            index.stored(k, e) in ok for k, e in zip(self._keys(entries), entries)
        )

    def verbatim(self, entries: list[Entry]) -> bool:
        return self._spans(entries) is not None

    def fill(self, spec: GroupSpec, buf: torch.Tensor) -> bool:
        for e in spec.entries:
            e.fill(buf, e.current())
        return False  # whether the bytes are the file's is read and compared in read_plan

    def read_plan(
        self, spec: GroupSpec, packed: torch.Tensor, verbatim: bool, direct: bool
    ) -> ReadPlan | None:
        self._offered += 1
        spans = self._spans(spec.entries)
        if spans is None:
            return None
        index, at = spans
        plan = index.read_plan_spans_if_same(at, packed, direct)
        self._read += plan is not None
        return plan

    def has_truth(self, spec: GroupSpec) -> bool:
        """The checkpoint holds every tensor of the group, shaped alike and castable (repair
        then checks the bytes it gives are the ones laid out)."""
        if self._spans(spec.entries) is not None:
            return True
        return self._all(spec.entries, (Stored.VERBATIM, Stored.CAST))

    def refill(self, spec: GroupSpec, buf: torch.Tensor) -> None:
        """The group's tensors read from the checkpoint and cast into their places in
        ``buf`` (as ``load_state_dict`` casts: ``copy_``)."""
        spans = self._spans(spec.entries)
        if spans is not None:
            stored, at = spans
            with stored:
                for key, off, n in at:
                    stored.read_into(stored.entries[key], byte_view(buf[off : off + n]))
            return
        index = self.index
        assert index is not None
        with index:
            for k, e in zip(self._keys(spec.entries), spec.entries):
                e.parts[0].view(buf).copy_(index.read_stored(index.entries[k]))

    def truth_name(self) -> str:
        return self._file_names()

    def place_outside(self, model: nn.Module, plan: OffloadPlan) -> None:
        pass  # the model's own tensors: they move as they are

    def restore_outside(self) -> None:
        pass


#: How core's quantized formats name a weight's scale beside it (fp8_scaled, comfy_quant).
SCALE_NAMES = ("scale_weight", "weight_scale")


def _beside(first: tuple[CheckpointIndex, str], part: Part) -> tuple[CheckpointIndex, str] | None:
    """The key of a quantized weight's scale that its loader copied out of the file (a
    scalar core keeps as its own tensor): stored beside the weight's own key, under the
    name its format gives it, with the part's dtype and size. Its bytes are compared with
    the file's like every other (``read_plan``)."""
    index, key = first
    if not key.endswith("weight"):
        return None
    base = key[: -len("weight")]
    for name in SCALE_NAMES:
        st = index.entries.get(base + name)
        if st is not None and st.dtype == part.dtype and st.shape == part.size:
            return index, st.key
    return None


def _part_name(e: Entry, i: int) -> str:
    return f"{e.qualname}#{i}"
