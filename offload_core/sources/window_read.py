"""A group whose tensors lie in a file at offsets that are not whole pages (the user's own
checkpoint): the whole pages around them read with O_DIRECT through a small bounce buffer,
each tensor's bytes copied to its place in the slab, instead of one page-cache read per
tensor.

[Note: the window read]
A checkpoint packs its tensors back to back at arbitrary offsets and in its own key order,
and a group's slab keeps each at a 64-byte-aligned offset in the model's order (sources/
checkpoint.py says why), so the bytes cannot be read straight to their places with O_DIRECT.
The window is the file's whole pages from the group's first tensor to its last; it is read
in ``BOUNCE`` pieces into two bounce buffers in turn, and every run of the plan that overlaps
a piece is copied from its bounce buffer to ``buf`` (the slot on a CPU, the staging buffer on
a GPU). A bounce buffer is refilled only after the copy out of it returned. Both are the load
thread's own (one thread issues every load: transfer/copies.py), so no two reads share them. A window that would read much more than the group's
own bytes (other tensors between them, ``MAX_EXTRA``) is not used: those groups keep the
per-tensor page-cache reads, as does a file or buffer that refuses O_DIRECT. The copies are
``ctypes.memmove`` on another thread (the GIL released), so the next piece is read while the
last is copied, and compute goes on beside both. Measured on the 2-core VM, the Flux
benchmark model read from its checkpoint, the engine before and after in one process
(``bench.ab_versions --paths ckpt --levels block,leaf``, 7 rounds): block level 0.662 x the
time, leaf level 0.413 x (docs/benchmarks.md, "The window read"); 16 MiB pieces copied
out after each read, not beside it, read 1.7 GB/s in the forward, beside it 2.1-2.3.
"""

from __future__ import annotations

import ctypes
import errno
import os
from concurrent.futures import Executor, Future
from dataclasses import dataclass

import torch

from ..errors import CorruptGroupFileError
from ..model.layout import align_up
from ..units import PAGE
from .reads import Chunk, ReadPlan, bytes_view, damaged_hint

#: The bounce buffer's size: 16 MiB pieces read as fast as one request per window here.
BOUNCE = 16 << 20
#: A window may read this fraction more than the group's own bytes (a small tensor of
#: another group between two of this one's); beyond it the per-tensor reads are cheaper.
MAX_EXTRA = 1 / 16


@dataclass(frozen=True)
class Window:
    start: int  # page-aligned file offset the read starts at
    end: int  # page-aligned file offset it stops at (may lie past the file's end)
    needed: int  # file offset of the last byte any run needs, plus one
    runs: tuple[Chunk, ...]  # the plan's runs in file order


def window_for(plan: ReadPlan) -> Window | None:
    """The plan's window, or None where it does not apply (see the Note)."""
    runs = sorted(plan.runs, key=lambda r: r.file_offset)
    if not runs or all(
        r.file_offset % PAGE == 0 and r.nbytes % PAGE == 0 and r.buf_offset % PAGE == 0
        for r in runs
    ):
        return None  # already whole pages: read as they are, O_DIRECT where possible
    start = runs[0].file_offset // PAGE * PAGE
    needed = max(r.file_offset + r.nbytes for r in runs)
    end = align_up(needed, PAGE)
    if end - start > plan.nbytes * (1 + MAX_EXTRA) + 2 * PAGE:
        return None
    return Window(start, end, needed, tuple(runs))


def read_window(
    plan: ReadPlan,
    window: Window,
    buf: torch.Tensor,
    bounces: tuple[torch.Tensor, torch.Tensor],
    copier: Executor,
) -> bool:
    """Every run of ``window`` into its place in ``buf``, the pieces read into the two
    ``bounces`` in turn while ``copier`` copies the one before out (the disk never waits for
    a copy). False (``buf`` partly written, nothing promised) where this file or buffer
    refuses O_DIRECT: read it per run instead."""
    piece = min(b.numel() for b in bounces)
    pending: list[Future[None] | None] = [None, None]  # the last copy out of each
    try:
        for k, at in enumerate(range(window.start, window.end, piece)):
            bounce = bounces[k % 2]
            if (last := pending[k % 2]) is not None:
                last.result()  # its last copy out is done: it may be refilled
            want = min(piece, window.end - at)
            got = _read_piece(plan, bytes_view(bounce), at, want, min(want, window.needed - at))
            if got < 0:
                return False
            pending[k % 2] = copier.submit(_copy_out, window, buf, bounce, at, got)
    finally:
        for f in pending:
            if f is not None:
                f.result()
    return True


def _copy_out(window: Window, buf: torch.Tensor, bounce: torch.Tensor, at: int, got: int) -> None:
    """The parts of every run that file bytes ``at .. at + got`` hold, from ``bounce`` to
    their places in ``buf``."""
    base, src = buf.data_ptr(), bounce.data_ptr()
    for r in window.runs:
        lo, hi = max(r.file_offset, at), min(r.file_offset + r.nbytes, at + got)
        if lo < hi:
            ctypes.memmove(base + r.buf_offset + lo - r.file_offset, src + lo - at, hi - lo)


def _read_piece(plan: ReadPlan, mv: memoryview, at: int, want: int, must: int) -> int:
    """Up to ``want`` bytes at file offset ``at`` into ``mv``: at least ``must`` (the file
    may end after those), -1 where O_DIRECT is refused."""
    got = 0
    while got < want:
        try:
            n = os.preadv(plan.direct_fd, [mv[got:want]], at + got)
        except OSError as e:
            if e.errno == errno.EINVAL:
                return -1
            raise
        got += n
        if n == 0 or n % PAGE:
            break  # the file's end
    if got < must:
        raise CorruptGroupFileError(
            f"{plan.path} is truncated (ended {must - got} bytes early); its contents were "
            f"not used. {damaged_hint(plan)}"
        )
    return got
