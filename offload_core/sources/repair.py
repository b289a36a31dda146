"""Rewriting a damaged group file from the group's source of truth.

A group file Ferry wrote is a copy: where the model was laid out from its checkpoint
(``load_offloaded``: ``CheckpointWeights`` knows every tensor's original bytes), a file that
was truncated, overwritten or had a byte flipped is read again from the checkpoint and
written anew, atomically (``GroupStore.write_group``: ``*.tmp``, fsync, rename), and the
group gets a fresh source and fresh host forms on the new file. The forward that met the
damage then reads the group again and goes on. A group whose only copy was the damaged file
(a model that lived in RAM before it was laid out), or whose source is the user's own
checkpoint, cannot be repaired: its error stands, and ``OffloadHandle.remove()`` drops it.

[Note: repairing a group under the engine]
``repair_group`` runs on the engine's thread, from ``Engine._activate``, after the failed
load's future resolved: no reader thread uses the group's old descriptor or mapping then
(a group is in flight at most once in the schedule's window), so closing them is safe. The
group is not in a slot (``to_slot`` runs only after a load succeeded), so its entries point
at its host forms, which are replaced here with views of the new file.
"""

from __future__ import annotations

import errno
import logging
import os
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..errors import WeightsLostError
from ..formats.safetensors import HeaderError, pread_stored
from .file_source import FileSource
from .mapped import MappedSource
from .reads import ReadPlan, bytes_view

if TYPE_CHECKING:
    from ..formats.safetensors import StoredTensor
    from ..model.grouping import GroupSpec
    from ..runtime.group import GroupRuntime
    from ..transfer.backend import Backend
    from .placement import Placement

log = logging.getLogger("ferry")
Index = dict[str, "StoredTensor"]


def repairable(placement: Placement, rt: GroupRuntime) -> bool:
    """Whether the group's bytes are in a Ferry group file and have a source of truth."""
    plan = getattr(rt.source, "plan", None)
    return (
        placement.store is not None
        and plan is not None
        and plan.owned
        and placement.has_truth(rt.spec)
    )


def repair_group(placement: Placement, rt: GroupRuntime) -> bool:
    """Rewrites the group's file from its source of truth; False when it has none.
    See [Note: repairing a group under the engine]."""
    if not repairable(placement, rt):
        return False
    spec, old = rt.spec, rt.source
    slab = torch.zeros(spec.nbytes, dtype=torch.uint8)  # padding is checksummed: zeros
    placement.refill(spec, slab)
    old_plan = old.plan  # type: ignore[attr-defined]
    if not same_bytes(old_plan, slab):
        log.warning(
            "ferry: %s was damaged and %s no longer holds the same weights: not rewritten",
            old_plan.path.name,
            placement.truth_name(),
        )
        return False
    store = placement.store
    assert store is not None
    store.reopen()  # the whole folder may have been deleted
    plan = store.write_group(spec.index, spec.entries, slab)
    plan.verify_every_read = old_plan.verify_every_read
    placement.forget_mapping(str(old_plan.path))
    forms = placement._file_forms(spec, plan, checkpoint=False)
    if isinstance(old, MappedSource):
        new: FileSource | MappedSource = MappedSource(plan, placement._mapping(plan)[0])
    else:
        new = FileSource(plan)
    old.close(placement.backend)
    rt.source, rt.host_forms = new, forms
    for e, f in zip(spec.entries, forms):
        e.point_at(f)
    log.warning("ferry: %s was damaged; rewrote it from %s", plan.path.name, placement.truth_name())
    return True


def same_bytes(plan: ReadPlan, slab: torch.Tensor) -> bool:
    """The slab read again is the one laid out: the group file's CRC32s, recorded from the
    bytes written at apply, match it chunk by chunk (a checkpoint changed since, or a cast
    that differs, is never written in its place)."""
    data = bytes_view(slab)
    return all(
        zlib.crc32(data[c.buf_offset : c.buf_offset + c.nbytes]) == c.crc for c in plan.chunks
    )


def refill_from_index(
    path: Path, index: Index, prefix: str, spec: GroupSpec, buf: torch.Tensor
) -> None:
    """The group's tensors read from a checkpoint's index and cast into their places in
    ``buf`` (as ``load_state_dict`` casts: ``copy_``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        for e in spec.entries:
            st = index[prefix + e.qualname]
            raw = torch.empty(st.nbytes, dtype=torch.uint8)
            try:
                pread_stored(fd, st, bytes_view(raw), path.name)
            except HeaderError:
                raise OSError(errno.EIO, f"{path.name} ends inside {st.key}") from None
            e.parts[0].view(buf).copy_(raw.view(st.dtype).view(st.shape))
    finally:
        os.close(fd)


def in_index(index: Index, prefix: str, spec: GroupSpec) -> bool:
    """Every tensor of the group is in the checkpoint, shaped alike and castable."""
    for e in spec.entries:
        st = index.get(prefix + e.qualname)
        part = e.parts[0]
        if e.subclass is not None or st is None or st.shape != tuple(part.size):
            return False
        if not (
            st.dtype == part.dtype or (st.dtype.is_floating_point and part.dtype.is_floating_point)
        ):
            return False
    return True


def drop_group(rt: GroupRuntime, backend: Backend) -> None:
    """A group whose bytes cannot be read back: its tensors go to the meta device (a model
    that uses them fails loudly, never computes on garbage) and its source is closed."""
    for e in rt.spec.entries:
        cur = e.current()
        meta = torch.empty_like(cur, device="meta")
        if e.is_param:
            e.module._parameters[e.attr] = torch.nn.Parameter(meta, requires_grad=False)
        else:
            e.module._buffers[e.attr] = meta
    rt.host_forms = []
    try:
        rt.source.close(backend)
    except OSError as e:  # the descriptor is gone with the file's weights: nothing to keep
        log.debug("ferry: closing %s: %s", rt.name, e)


def lost_error(lost: list[GroupRuntime], first: BaseException) -> BaseException:
    """The error remove() raises once everything else is restored."""
    if not lost or not isinstance(first, Exception):
        return first  # an interrupt stays an interrupt
    files = [str(getattr(getattr(rt.source, "plan", None), "path", rt.name)) for rt in lost]
    return WeightsLostError([rt.name for rt in lost], files, first)
