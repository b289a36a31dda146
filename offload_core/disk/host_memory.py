"""Host memory that disk reads land in (the CPU ring, staging and host slabs), backed by huge
pages where the OS gives them.

[Note: where a direct read lands]
An O_DIRECT read is DMA into the destination's physical pages. Why their layout matters, as
far as we can tell (the rates below are measured; this is the mechanism that fits them): the
block layer joins only physically contiguous pages into one segment: a request carries at most
``max_segments`` segments (254 on this project's virtio disk, 127-ish on NVMe). Into scattered
4 KiB pages a request is ~1 MiB however large the read, and the disk sees many small
requests. ``torch.empty`` memory is faulted in page by page, by whichever threads touch it
first (a multi-threaded fill, four reader threads checking CRCs), so its pages are scattered.
Measured on the 2-core VM (``python -m bench.read_destination``: 2.5 GB cold, 340 MiB
O_DIRECT requests, medians of 5 shuffled rounds): into ``torch.empty`` memory filled by torch
1.50 GB/s, into ``torch.empty`` memory first touched by the read 2.31, into this module's
buffer 2.85; the benchmark's raw read (64 MiB requests into one reused buffer) 2.01. In the
engine the block-level reader went from 0.58 x to 1.05 x that raw read (docs/benchmarks.md,
"Where a direct read lands").

So where transparent huge pages are ``always`` or ``madvise`` (the usual Linux default), a
buffer of at least one huge page is an anonymous private mapping advised ``MADV_HUGEPAGE``
and populated at once (``MADV_POPULATE_WRITE``, Linux 5.14+), so its huge pages are taken
when it is made, not in the middle of a read. Elsewhere (another OS, ``never``) it is
``torch.empty`` memory, as before: populating 4 KiB pages up front measured no better (a
one-off probe: 0.99 GB/s against 1.19 for pages first touched by the read).
"""

from __future__ import annotations

import mmap
from collections.abc import Callable

import torch

from ..units import PAGE
from .files import files

HUGE_PAGE = 2 << 20


def host_buffer(nbytes: int, mapping: Callable[[int], mmap.mmap] | None = None) -> torch.Tensor:
    """A uint8 CPU tensor of ``nbytes`` starting on a page boundary (on a huge page where
    the OS allows), its memory freed when the last view of it is.

    ``mapping(length)``: the buffer is always an anonymous private mapping made by it (an
    ``mmap.mmap`` subclass whose ``__del__`` runs before the memory is unmapped: the CUDA
    backend unregisters pinned memory there)."""
    if nbytes >= HUGE_PAGE and huge_pages_advisable():
        return _huge_page_buffer(nbytes, mapping or _private_mapping)
    if mapping is not None:
        return torch.frombuffer(mapping(max(nbytes, 1)), dtype=torch.uint8, count=nbytes)
    return _page_aligned(nbytes)


def _private_mapping(length: int) -> mmap.mmap:
    return mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE)


def huge_pages_advisable() -> bool:
    """Whether a large buffer can be asked for on huge pages here (the platform's backend
    knows: Linux with transparent huge pages set to ``always`` or ``madvise``)."""
    return files().huge_pages


def _page_aligned(nbytes: int) -> torch.Tensor:
    raw = torch.empty(nbytes + PAGE, dtype=torch.uint8)
    skip = (-raw.data_ptr()) % PAGE
    return raw[skip : skip + nbytes]


def _huge_page_buffer(nbytes: int, make: Callable[[int], mmap.mmap]) -> torch.Tensor:
    # One huge page of slack, so the buffer can start on a huge-page boundary on kernels
    # that do not align large anonymous mappings themselves (before 6.7); never touched.
    length = nbytes + HUGE_PAGE
    # Private: transparent huge pages back private anonymous memory (shared takes shmem's).
    mapping = make(length)
    skip = (-torch.frombuffer(mapping, dtype=torch.uint8, count=1).data_ptr()) % HUGE_PAGE
    files().advise_huge(mapping, skip, nbytes + (-nbytes) % PAGE)
    # Its own storage from ``skip`` on (not a view of the whole mapping), so the storage
    # starts where the buffer does: ``Tensor.is_pinned()`` asks about the storage's first
    # byte ([Note: pinned memory is unregistered before it is unmapped]). It keeps
    # ``mapping`` alive.
    return torch.frombuffer(mapping, dtype=torch.uint8, offset=skip, count=nbytes)
