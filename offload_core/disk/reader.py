"""The one reader: executes a read plan (plan.py) into a host buffer, checked as [Note: what
is checked when] says: per chunk with their CRC32s, per contiguous run, or the window of
whole pages around the runs; O_DIRECT where the pages allow, buffered where they do not or
the file refuses it. It owns the threads reads run on (one load thread, in submission
order; a pool for checked chunks and window copies) and the window's bounce buffers. Every
file call goes through the platform's backend (files.py).

[Note: the window read]
A checkpoint packs its tensors back to back at arbitrary offsets and in its own key order,
and a group's slab keeps each at a 64-byte-aligned offset in the model's order (sources/
checkpoint.py says why), so the bytes cannot be read straight to their places with O_DIRECT.
The window is the file's whole pages from the group's first tensor to its last; it is read
in ``BOUNCE`` pieces into two bounce buffers in turn, and every run of the plan that overlaps
a piece is copied from its bounce buffer to ``buf`` (the slot on a CPU, the staging buffer on
a GPU). A bounce buffer is refilled only after the copy out of it returned. Both are the load
thread's own (one thread issues every load), so no two reads share them. A window that would
read much more than the group's own bytes (other tensors between them, ``MAX_EXTRA`` in
plan.py) is not used: those groups keep the per-tensor page-cache reads, as does a file or
buffer that refuses O_DIRECT. The copies are ``ctypes.memmove`` on another thread (the GIL
released), so the next piece is read while the last is copied, and compute goes on beside
both. Measured on the 2-core VM, the Flux benchmark model read from its checkpoint, the
engine before and after in one process (``bench.ab_versions --paths ckpt --levels
block,leaf``, 7 rounds): block level 0.662 x the time, leaf level 0.413 x (docs/
benchmarks.md, "The window read"); 16 MiB pieces copied out after each read, not beside it,
read 1.7 GB/s in the forward, beside it 2.1-2.3.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor, wait
from typing import Any, Protocol, TypeVar

import torch

from ..formats.header import StoredTensor
from ..formats.safetensors import byte_view
from ..units import PAGE
from .files import FileBackend
from .host_memory import host_buffer
from .plan import Chunk, ReadPlan, Window, check_chunk, check_identity, truncated

T = TypeVar("T")
#: The bounce buffer's size: 16 MiB pieces read as fast as one request per window here.
BOUNCE = 16 << 20
#: The smallest piece of a slab ``Reader.copy_in`` gives a thread of its own.
MIN_PIECE = 4 << 20


class ReadClock(Protocol):
    """Where the reader counts its reads (runtime/stats.py: Counters)."""

    def read_started(self) -> None: ...
    def read_finished(self, nbytes: int) -> None: ...


class Reader:
    """Executes read plans on its threads. ``threads``: the pool checked chunks fan out on."""

    def __init__(self, clock: ReadClock, threads: int = 4) -> None:
        self.clock = clock
        self.threads = threads
        self._load_thread: ThreadPoolExecutor | None = None
        self._pool: ThreadPoolExecutor | None = None
        #: The load thread's two bounce buffers for window reads (made at the first one).
        self._bounces: tuple[torch.Tensor, torch.Tensor] | None = None

    def submit(self, work: Callable[..., T], *args: Any) -> Future[T]:
        """Runs ``work(*args)`` on the load thread, after the work submitted before it."""
        if self._load_thread is None:
            # One load thread: loads run in step order, so the group needed next is read
            # first, with the disk's whole bandwidth, instead of sharing it with the groups
            # after it (a read is one large request the kernel already splits and keeps in
            # flight; checked reads still fan out per chunk on the pool). With a thread per
            # load, the byte ring's wider leaf window made forwards 9 % slower; with one, 8 %
            # faster (docs/benchmarks.md, "Prefetch by bytes").
            self._load_thread = ThreadPoolExecutor(1, thread_name_prefix="ferry-load")
        return self._load_thread.submit(work, *args)

    def read(self, plan: ReadPlan, buf: torch.Tensor) -> None:
        """Every chunk of ``plan`` into ``buf``, checked as [Note: what is checked when]
        (disk/plan.py) says. Runs on the calling thread (the load thread)."""
        self.clock.read_started()
        done = 0
        try:
            changed = check_identity(plan)
            verify = plan.needs_checksums(changed)
            parts = plan.chunks if verify else plan.runs  # checked: per chunk, CRCs in parallel
            if not verify and self._read_window(plan, buf):
                pass  # the whole pages around the tensors at once: [Note: the window read]
            elif len(parts) == 1:
                read_chunk(plan, parts[0], buf, verify)  # one request: no hop to another thread
            else:
                futures = [self._threads().submit(read_chunk, plan, c, buf, verify) for c in parts]
                wait(futures)
                for f in futures:
                    f.result()  # re-raises a truncated or corrupt chunk
            plan.accept(changed)
            done = plan.nbytes
        finally:
            self.clock.read_finished(done)

    def copy_in(self, src: torch.Tensor, dst: torch.Tensor, nbytes: int) -> None:
        """The first ``nbytes`` of ``src`` (a slab in RAM) into ``dst`` (a staging buffer),
        in up to ``threads`` pieces copied at once on the pool ([Note: the RAM tier through
        staging] in transfer/copies.py). Runs on the calling thread (the load thread); not a
        disk read, so not counted as one."""
        pieces = copy_pieces(nbytes, self.threads)
        s, d = src.data_ptr(), dst.data_ptr()
        if len(pieces) == 1:
            ctypes.memmove(d, s, nbytes)
            return
        futures = [self._threads().submit(ctypes.memmove, d + o, s + o, n) for o, n in pieces]
        wait(futures)
        for f in futures:
            f.result()

    def timed(self, nbytes: int, read: Callable[[], None]) -> None:
        """A read another object issues (a mapped group faulting its pages in), counted."""
        self.clock.read_started()
        done = 0
        try:
            read()
            done = nbytes
        finally:
            self.clock.read_finished(done)

    def _read_window(self, plan: ReadPlan, buf: torch.Tensor) -> bool:
        window = plan.window
        if plan.direct_fd < 0 or window is None:
            return False
        if self._bounces is None:
            self._bounces = (host_buffer(BOUNCE), host_buffer(BOUNCE))
        if read_window(plan, window, buf, self._bounces, self._threads()):
            return True
        plan.drop_direct()  # O_DIRECT refused for this file: per-run reads from now on
        return False

    def _threads(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="ferry-read")
        return self._pool

    def close(self) -> None:
        """Joins the threads and lets the bounce buffers go."""
        for pool in (self._load_thread, self._pool):
            if pool is not None:
                pool.shutdown(wait=True)
        self._load_thread = self._pool = None
        self._bounces = None


def copy_pieces(nbytes: int, threads: int) -> list[tuple[int, int]]:
    """(offset, length) pieces of a copy of ``nbytes`` for ``threads`` threads: equal,
    64-byte aligned, none under ``MIN_PIECE`` (a thread's hop costs more than a small copy)."""
    count = max(1, min(threads, nbytes // MIN_PIECE))
    if count == 1:
        return [(0, nbytes)]
    step = (nbytes + count - 1) // count
    step = (step + 63) // 64 * 64
    return [(o, min(step, nbytes - o)) for o in range(0, nbytes, step)]


def pread_full(backend: FileBackend, fd: int, into: memoryview, offset: int) -> int:
    """Reads ``into`` whole from ``offset`` unless the file ends first; returns the bytes read."""
    got = 0
    while got < len(into):
        n = backend.pread(fd, into[got:], offset + got)
        if n == 0:
            break
        got += n
    return got


def read_stored(backend: FileBackend, fd: int, entry: StoredTensor, into: memoryview) -> bool:
    """The bytes ``entry`` has in its file into ``into`` (at least ``entry.nbytes`` long);
    False when the file ends first (it was truncated or replaced): the caller names the file
    and what to do in its own error."""
    return pread_full(backend, fd, into[: entry.nbytes], entry.start) == entry.nbytes


def read_stored_new(backend: FileBackend, fd: int, entry: StoredTensor) -> torch.Tensor | None:
    """``entry`` as stored (its dtype and shape) in a new tensor of its own, allocator-aligned
    as a loaded weight is; None when the file ends first."""
    raw = torch.empty(entry.nbytes, dtype=torch.uint8)
    if not read_stored(backend, fd, entry, byte_view(raw)):
        return None
    return raw.view(entry.dtype).view(entry.shape)


def read_chunk(plan: ReadPlan, chunk: Chunk, buf: torch.Tensor, verify: bool = True) -> None:
    """Reads one chunk into ``buf`` at its offset and, with ``verify``, checks its CRC32.
    Runs on a worker thread (the read releases the GIL, so reads overlap compute)."""
    mv = byte_view(buf)[chunk.buf_offset : chunk.buf_offset + chunk.nbytes]
    got = 0
    direct = plan.direct_fd
    if direct >= 0 and not _aligned(
        chunk.file_offset, chunk.nbytes, buf.data_ptr() + chunk.buf_offset
    ):
        direct = -1
    backend = plan.files
    while got < chunk.nbytes:
        if direct >= 0:
            n = backend.pread_direct(direct, mv[got:], chunk.file_offset + got)
            if n is None:
                direct = -1  # this filesystem or offset will not do direct I/O
                continue
            if n % PAGE:
                direct = -1  # a short read ends unaligned: finish buffered
        else:
            n = backend.pread(plan.fd, mv[got:], chunk.file_offset + got)
        if n == 0:
            raise truncated(plan, chunk.nbytes - got)
        got += n
    if verify:
        check_chunk(plan, chunk, mv)


def read_all(plan: ReadPlan, buf: torch.Tensor) -> None:
    """Every chunk into ``buf``, checked, on the calling thread (restore, first checks)."""
    for c in plan.chunks:
        read_chunk(plan, c, buf)


def _aligned(*values: int) -> bool:
    return all(v % PAGE == 0 for v in values)


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
            got = _read_piece(plan, byte_view(bounce), at, want, min(want, window.needed - at))
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
    backend = plan.files
    while got < want:
        n = backend.pread_direct(plan.direct_fd, mv[got:want], at + got)
        if n is None:
            return -1
        got += n
        if n == 0 or n % PAGE:
            break  # the file's end
    if got < must:
        raise truncated(plan, must - got)
    return got
