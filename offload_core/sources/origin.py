"""Where a placement's bytes come from: the strategy ``Placement`` is given.

- ``ModelOrigin``: the model's own tensors, already in memory (``apply_offload``), with the
  user's checkpoint beside them where ``DiskTier(source_checkpoint=...)`` names it: groups
  whose bytes are the file's are read from it (compared once, at apply), and a damaged group
  file is rewritten from it.
- ``CheckpointOrigin`` (checkpoint_origin.py): a meta-built model whose tensors wait in its
  checkpoint (``load_offloaded``).
The placement asks an origin five things: which groups will be read from the checkpoint
(before anything moves, to size the folder), to fill a group's slab, the read plan of a group
read from the checkpoint, the group's source of truth for repair, and the tensors outside the
groups (placed on the device and put back).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from ..disk.plan import ReadPlan
from ..model.grouping import GroupSpec
from ..model.layout import Entry
from ..model.plan import OffloadPlan
from ..policy import DiskTier
from .checkpoint import CheckpointIndex, Stored


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


class ModelOrigin:
    """The model's own tensors (and, with ``source_checkpoint``, the file they came from)."""

    def __init__(self) -> None:
        self.index: CheckpointIndex | None = None
        self.prefix = ""

    def opened(self, plan: OffloadPlan, notes: list[str]) -> AbstractContextManager[object]:
        tier = plan.policy.tier
        if isinstance(tier, DiskTier) and tier.source_checkpoint:
            index = CheckpointIndex.open(Path(tier.source_checkpoint), "source_checkpoint")
            names = [e.qualname for g in plan.grouping.groups for e in g.entries]
            prefix = index.prefix_for(names)
            if prefix is None:
                notes.append(
                    "source_checkpoint holds none of the model's tensors: groups are written"
                )
            else:
                self.index, self.prefix = index, prefix
        return nullcontext()

    def _keys(self, entries: list[Entry]) -> list[str]:
        return [self.prefix + e.qualname for e in entries]

    def _all(self, entries: list[Entry], ok: tuple[Stored, ...]) -> bool:
        index = self.index
        return index is not None and all(
            index.stored(k, e) in ok for k, e in zip(self._keys(entries), entries)
        )

    def verbatim(self, entries: list[Entry]) -> bool:
        return self._all(entries, (Stored.VERBATIM,))

    def fill(self, spec: GroupSpec, buf: torch.Tensor) -> bool:
        for e in spec.entries:
            e.fill(buf, e.current())
        return False  # whether the bytes are the file's is read and compared in read_plan

    def read_plan(
        self, spec: GroupSpec, packed: torch.Tensor, verbatim: bool, direct: bool
    ) -> ReadPlan | None:
        if self.index is None or not self.verbatim(spec.entries):
            return None
        keys = self._keys(spec.entries)
        return self.index.read_plan_if_same(keys, spec.entries, packed, direct)

    def has_truth(self, spec: GroupSpec) -> bool:
        """The checkpoint holds every tensor of the group, shaped alike and castable (repair
        then checks the bytes it gives are the ones laid out)."""
        return self._all(spec.entries, (Stored.VERBATIM, Stored.CAST))

    def refill(self, spec: GroupSpec, buf: torch.Tensor) -> None:
        """The group's tensors read from the checkpoint and cast into their places in
        ``buf`` (as ``load_state_dict`` casts: ``copy_``)."""
        index = self.index
        assert index is not None
        with index:
            for k, e in zip(self._keys(spec.entries), spec.entries):
                e.parts[0].view(buf).copy_(index.read_stored(index.entries[k]))

    def truth_name(self) -> str:
        return self.index.path.name if self.index is not None else "nowhere"

    def place_outside(self, model: nn.Module, plan: OffloadPlan) -> None:
        pass  # the model's own tensors: they move as they are

    def restore_outside(self) -> None:
        pass
