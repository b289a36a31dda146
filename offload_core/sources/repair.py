"""Rewriting a damaged group file from the group's source of truth.

A group file Ferry wrote is a copy: where the model was laid out from its checkpoint
(``load_offloaded``: ``CheckpointWeights`` knows every tensor's original bytes), or beside the
checkpoint it came from (``DiskTier(source_checkpoint=...)``), a file that was truncated,
overwritten or had a byte flipped is read again from the placement's origin (its source of
truth: origin.py) and written anew, atomically (``Placement.rewrite``: ``GroupStore.
write_group``'s ``*.tmp``, fsync, rename), and the group gets a fresh source and fresh host
forms on the new file. The forward that met the damage then reads the group again and goes on. A group whose only copy was the damaged file
(a model that lived in RAM before it was laid out), or whose source is the user's own
checkpoint, cannot be repaired: its error stands, and ``OffloadHandle.remove()`` drops it.

[Note: repairing a group under the engine]
``repair_group`` runs on the engine's thread, from ``Engine._activate``, after the failed
load's future resolved: no reader thread uses the group's old descriptor or mapping then
(a group is in flight at most once in the schedule's window), so closing them is safe. The
group is not in a slot (``to_slot`` runs only after a load succeeded), so its entries point
at its host forms, which ``Placement.rewrite`` replaces with views of the new file.
"""

from __future__ import annotations

import logging
import zlib

import torch

from ..disk.plan import ReadPlan
from ..formats.safetensors import byte_view
from ..runtime.group import GroupRuntime
from .placement import Placement

log = logging.getLogger("ferry")


def repairable(placement: Placement, rt: GroupRuntime) -> ReadPlan | None:
    """The read plan of the group's Ferry group file, where the group has a source of truth
    to rewrite it from; None otherwise."""
    plan = getattr(rt.source, "plan", None)
    if placement.store is None or not isinstance(plan, ReadPlan) or not plan.owned:
        return None
    return plan if placement.origin.has_truth(rt.spec) else None


def repair_group(placement: Placement, rt: GroupRuntime) -> bool:
    """Rewrites the group's file from its source of truth; False when it has none.
    See [Note: repairing a group under the engine]."""
    old_plan = repairable(placement, rt)
    if old_plan is None:
        return False
    truth = placement.origin
    slab = torch.zeros(rt.spec.nbytes, dtype=torch.uint8)  # padding is checksummed: zeros
    truth.refill(rt.spec, slab)
    if not same_bytes(old_plan, slab):
        log.warning(
            "ferry: %s was damaged and %s no longer holds the same weights: not rewritten",
            old_plan.path.name,
            truth.truth_name(),
        )
        return False
    plan = placement.rewrite(rt, slab)
    log.warning("ferry: %s was damaged; rewrote it from %s", plan.path.name, truth.truth_name())
    return True


def same_bytes(plan: ReadPlan, slab: torch.Tensor) -> bool:
    """The slab read again is the one laid out: the group file's CRC32s, recorded from the
    bytes written at apply, match it chunk by chunk (a checkpoint changed since, or a cast
    that differs, is never written in its place)."""
    data = byte_view(slab)
    return all(
        zlib.crc32(data[c.buf_offset : c.buf_offset + c.nbytes]) == c.crc for c in plan.chunks
    )
