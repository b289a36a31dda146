"""Disk-tier groups a CPU computes on straight from the group file's page cache.

[Note: mapped groups]
On a CPU onload device a group file's private (copy-on-write) mapping is already memory the
CPU can compute on: from apply on, the group's entries point at 64-byte-aligned views of it
(the same offsets as a slot, so the arithmetic, and the output, is the resident model's).
Loading such a group asks the kernel for its pages (``MADV_POPULATE_READ`` on a reader
thread: the disk read overlaps the previous group's compute and the kernel's readahead runs
at the disk's buffered speed); releasing it drops the mapping's page-table entries
(``MADV_DONTNEED``), so the process maps at most the groups in the prefetch window, never the
whole model. No slot, no copy: the bytes go from the disk to the page cache and are used
there. The page cache is left to the kernel: it reclaims it under memory pressure and keeps
it while RAM is free (then the next forward reads nothing from the disk).
Ordering needs nothing beyond the pre-hook waiting on the load's future: the CPU computes on
the host's timeline, so when a group is released its forward is done. ``MADV_DONTNEED``
cannot lose data: the mapping is never written (a stray in-place write lands in a private
copy, which it discards) and a later touch faults the same bytes back in from the file.
A write to the file by anyone changes its identity (ctime), which is checked before the load
and again at release, so a forward that computed on changed bytes fails instead of returning
them. A file truncated by another process while one of its groups computes raises SIGBUS, as
it does under any mmapped checkpoint loader; a truncation at any other time is caught by the
identity check.
"""

from __future__ import annotations

import errno
import mmap
from concurrent.futures import Future
from typing import Any, Literal

import torch

from ..errors import CorruptGroupFileError
from .files import files
from .loads import Loads
from .plan import ReadPlan, check_chunk, check_identity, damaged_hint
from .reader import read_all

#: cpu_read="auto" copies into slots while they take at most this share of the RAM available
#: at apply; above it RAM is the constraint and the groups are computed from the mapping.
COPY_RAM_SHARE = 0.25


def can_map() -> bool:
    """Mapped groups need madvise's Linux semantics (DONTNEED drops the pages at once): the
    platform's backend says whether it has them (disk/files.py)."""
    return files().maps_groups


def choose_cpu_read(
    asked: str, slots_bytes: int, available: int | None
) -> Literal["mapped", "copy"]:
    """The disk tier's read path on a CPU onload device.

    "auto" copies: measured on a 2-core VM (docs/benchmarks.md), computing from a reused slot
    filled by O_DIRECT reads beat computing from freshly read page cache in every regime
    (each cold forward maps new page-cache pages, which the guest faults in again). The
    mapped path holds no anonymous slots, so it is kept where the slots would take more than
    ``COPY_RAM_SHARE`` of the available RAM (or ``available`` is unknown and the platform
    maps: the safe side for RAM), and wherever it is asked for.
    """
    if asked in ("mapped", "copy"):
        return asked  # type: ignore[return-value]
    if not can_map():
        return "copy"
    if available is None or slots_bytes > available * COPY_RAM_SHARE:
        return "mapped"
    return "copy"


class MappedSource:
    """One group's own group file, mapped: ``length`` bytes from its first byte (the
    header's page is faulted in beside the data when the checksums are read, fault-around,
    so it is dropped with it). See [Note: mapped groups]."""

    uses_slot = False

    def __init__(self, plan: ReadPlan, mm: mmap.mmap) -> None:
        self.file_plan = plan
        self.mm: mmap.mmap | None = mm
        self.length = max(c.file_offset + c.nbytes for c in plan.chunks)

    def load(self, transfers: Loads, slot: Any) -> Future[Any]:
        return transfers.run_read(self.file_plan.nbytes, self._fault_in)

    def discard(self) -> None:
        self.unmap()

    def host_bytes(self, nbytes: int) -> torch.Tensor:
        buf = torch.empty(nbytes, dtype=torch.uint8)
        read_all(self.file_plan, buf)
        return buf

    def close(self, backend: object) -> None:
        # The mapping goes with the last view of it (the file's space too): drop ours.
        self.mm = None
        self.file_plan.close()

    def _fault_in(self) -> None:
        """Brings the group's pages in (a reader thread), checked."""
        changed = check_identity(self.file_plan)
        if self.file_plan.needs_checksums(changed):
            self._verify()  # reading every byte for the checksums faults the pages in too
        else:
            self._populate()
        self.file_plan.accept(changed)

    def unmap(self) -> None:
        """Drops the group's pages from the process."""
        if self.mm is not None:
            self.file_plan.files.drop_pages(self.mm, self.length)

    def release(self) -> None:
        """After the group's forward: unmap its pages, then make sure nobody wrote the file
        while it computed (if someone did, the bytes must still be the ones written at apply,
        else the forward fails rather than return what they computed)."""
        self.unmap()
        changed = check_identity(self.file_plan)
        if changed is not None:
            self._verify()  # faults the pages in again: drop them again
            self.unmap()
            self.file_plan.accept(changed)

    def _verify(self) -> None:
        # The size was checked first (check_identity), so every chunk lies inside the file.
        assert self.mm is not None
        view = memoryview(self.mm)
        try:
            for c in self.file_plan.chunks:
                check_chunk(self.file_plan, c, view[c.file_offset : c.file_offset + c.nbytes])
        finally:
            view.release()

    def _populate(self) -> None:
        assert self.mm is not None
        try:
            self.file_plan.files.populate(self.mm, self.length)
        except OSError as e:
            if e.errno == errno.EFAULT:
                # Where an access would raise SIGBUS: the file ends before the group does,
                # or the disk failed to read a page (EIO): reported here, never at compute.
                raise CorruptGroupFileError(
                    f"{self.file_plan.path} is truncated or could not be read (an I/O error); its "
                    "contents were not used. " + damaged_hint(self.file_plan)
                ) from None
            else:
                raise
