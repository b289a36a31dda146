"""Rewriting a damaged group file from the group's source of truth.

A group file Ferry wrote is a copy: where the model was laid out from its checkpoint
(``load_offloaded``: ``CheckpointWeights`` knows every tensor's original bytes), or beside the
checkpoint it came from (``DiskTier(source_checkpoint=...)``), a file that was truncated,
overwritten or had a byte flipped is read again from the placement's origin (its source of
truth: sources/origin.py) and written anew, atomically (sources/repair_group.py's ``rewrite_group``:
``GroupStore.write_group``'s ``*.tmp``, fsync, rename, store.py), and the group gets a fresh source and
fresh host forms on the new file. The forward that met the damage then reads the group again
and goes on. A group whose only copy was the damaged file (a model that lived in RAM before it
was laid out), or whose source is the user's own checkpoint, cannot be repaired: its error stands, and ``OffloadHandle.remove()`` drops it.

[Note: repairing a group under the engine]
A repair (sources/repair_group.py's ``repair_group``, with ``slab_from_truth`` here) runs on the engine's thread,
from ``Engine._activate``, after the failed load's future resolved: no reader thread uses the group's old descriptor or mapping then
(a group is in flight at most once in the schedule's window), so closing them is safe. The
group is not in a slot (``to_slot`` runs only after a load succeeded), so its entries point
at its host forms, which ``rewrite_group`` replaces with views of the new file.
"""

from __future__ import annotations

import logging
import zlib
from typing import Protocol

import torch

from ..formats.safetensors import byte_view
from ..model.grouping import GroupSpec
from .plan import ReadPlan
from .store import GroupStore

log = logging.getLogger("ferry")


class Truth(Protocol):
    """Where a group's bytes can be read again (sources/origin.py's ``Origin``)."""

    def has_truth(self, spec: GroupSpec) -> bool: ...

    def refill(self, spec: GroupSpec, slab: torch.Tensor) -> None: ...

    def truth_name(self) -> str: ...


def repairable(
    store: GroupStore | None, file_plan: ReadPlan | None, spec: GroupSpec, truth: Truth
) -> ReadPlan | None:
    """The read plan of the group's Ferry group file, where the group has a source of truth
    to rewrite it from; None otherwise (not on the disk tier, or a file Ferry did not
    write: the user's checkpoint is never rewritten)."""
    if store is None or file_plan is None or not file_plan.owned:
        return None
    return file_plan if truth.has_truth(spec) else None


def slab_from_truth(
    store: GroupStore | None, file_plan: ReadPlan | None, spec: GroupSpec, truth: Truth
) -> torch.Tensor | None:
    """The group file's bytes read again from the group's source of truth, where it has
    one and they are the bytes written at apply; None otherwise (the error stands). See
    [Note: repairing a group under the engine]."""
    old_plan = repairable(store, file_plan, spec, truth)
    if old_plan is None:
        return None
    slab = torch.zeros(spec.nbytes, dtype=torch.uint8)  # padding is checksummed: zeros
    truth.refill(spec, slab)
    if not same_bytes(old_plan, slab):
        log.warning(
            "ferry: %s was damaged and %s no longer holds the same weights: not rewritten",
            old_plan.path.name,
            truth.truth_name(),
        )
        return None
    return slab


def same_bytes(plan: ReadPlan, slab: torch.Tensor) -> bool:
    """The slab read again is the one laid out: the group file's CRC32s, recorded from the
    bytes written at apply, match it chunk by chunk (a checkpoint changed since, or a cast
    that differs, is never written in its place)."""
    data = byte_view(slab)
    return all(
        zlib.crc32(data[c.buf_offset : c.buf_offset + c.nbytes]) == c.crc for c in plan.chunks
    )
