"""What one group's read is: its chunks (with their CRC32s), the file's identity, and the
whole pages around them (the window).

[Note: what is checked when]
Every read checks the file's identity (inode, size, mtime, ctime: one ``fstat``). The
chunks' CRC32s are checked on the first read of each group in the process (``verified``),
and on any read after the identity changed (anyone wrote the file: ctime moves even when
size and mtime are put back); if they match, the new identity is recorded, else the read
fails. That catches what the identity cannot (a write the disk got wrong, a torn file from
an earlier run) at 0.29 CPU-s per GB once, not on every forward. ``DiskTier(verify=
"every_read")`` checks them on every read (media that can rot under an unchanged file).
A bad chunk raises CorruptGroupFileError; its bytes are never used.
A read whose checksums are not due is issued as one request per contiguous run of chunks
(``ReadPlan.runs``), not per chunk: the kernel splits a large request into the device's
largest requests and keeps them all in flight, so one system call and one thread wake-up per
group reach the disk's speed (measured beside compute on the 2-core VM: one 256 MiB-1 GiB
request 2.6-2.7 GB/s, four threads of 16 MiB 1.9-2.6 GB/s). O_DIRECT is used for a request
whose offsets and length are whole pages (a group file's data starts on a page; Flux's
block-level groups end on one too), the page cache for the rest (a group ending on a bias, a
tensor in the user's checkpoint), or the window around them ([Note: the window read] in
reader.py). How fast O_DIRECT is depends on where it lands:
[Note: where a direct read lands] (disk/host_memory.py).
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from ..errors import ConfigError, CorruptGroupFileError
from ..units import GIB, PAGE
from .files import FileBackend, files

#: Checksums are kept per chunk of this many bytes (and checked reads issued per chunk).
CHUNK = 16 << 20
#: An unchecked read joins contiguous chunks into requests of at most this many bytes.
RUN = GIB
#: A window may read this fraction more than the group's own bytes (a small tensor of
#: another group between two of this one's); beyond it the per-tensor reads are cheaper.
MAX_EXTRA = 1 / 16


@dataclass(frozen=True)
class Chunk:
    """``nbytes`` at ``file_offset`` land at ``buf_offset`` of the group's slab."""

    file_offset: int
    buf_offset: int
    nbytes: int
    crc: int


def checksummed(spans: list[tuple[int, int, int]], data: memoryview) -> list[Chunk]:
    """The chunks of ``spans`` (file offset, slab offset, bytes), each at most ``CHUNK``,
    with the CRC32 of the slab bytes ``data`` holds for it: the one place chunk lists are
    made (a group file's, a checkpoint group's)."""
    chunks = []
    for file_off, buf_off, n in spans:
        for o in range(0, n, CHUNK):
            m = min(CHUNK, n - o)
            crc = zlib.crc32(data[buf_off + o : buf_off + o + m])
            chunks.append(Chunk(file_off + o, buf_off + o, m, crc))
    return chunks


@dataclass(frozen=True)
class FileIdentity:
    """What changes whenever anyone writes the file: ctime cannot be set back by ``utime``,
    so a write that restores size and mtime is caught too."""

    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        return cls(st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass(frozen=True)
class Window:
    """The whole pages around a plan's runs ([Note: the window read] in reader.py)."""

    start: int  # page-aligned file offset the read starts at
    end: int  # page-aligned file offset it stops at (may lie past the file's end)
    needed: int  # file offset of the last byte any run needs, plus one
    runs: tuple[Chunk, ...]  # the plan's runs in file order


@dataclass
class ReadPlan:
    """How to bring one group's slab in from a file: its chunks and the file's identity.
    See [Note: what is checked when]."""

    path: Path
    fd: int
    identity: FileIdentity
    chunks: list[Chunk]
    owned: bool  # a Ferry group file (deleted on remove) or the user's checkpoint
    verified: bool = False  # the chunks' checksums matched once in this process
    verify_every_read: bool = False
    #: A second descriptor opened with O_DIRECT (-1: none). Page-aligned chunks are read
    #: through it straight into the (page-aligned) buffer: no page-cache copy, less CPU.
    direct_fd: int = -1
    #: The platform's file calls this plan's descriptors were opened with (disk/files.py),
    #: chosen once when the plan is made: every read of it goes through the same backend.
    files: FileBackend = field(default_factory=files, repr=False)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.chunks)

    @cached_property
    def runs(self) -> list[Chunk]:
        """The chunks joined where they continue each other in the file and in the slab:
        the requests of a read whose checksums are not due (their ``crc`` is unused)."""
        runs: list[Chunk] = []
        for c in self.chunks:
            last = runs[-1] if runs else None
            if (
                last is not None
                and last.file_offset + last.nbytes == c.file_offset
                and last.buf_offset + last.nbytes == c.buf_offset
                and last.nbytes + c.nbytes <= RUN
            ):
                runs[-1] = Chunk(last.file_offset, last.buf_offset, last.nbytes + c.nbytes, 0)
            else:
                runs.append(Chunk(c.file_offset, c.buf_offset, c.nbytes, 0))
        return runs

    @cached_property
    def window(self) -> Window | None:
        """The whole pages around this plan's runs (``window_for``), computed once."""
        return window_for(self)

    @property
    def span(self) -> int:
        """The slab bytes the chunks cover (from the slab's start)."""
        return max((c.buf_offset + c.nbytes for c in self.chunks), default=0)

    @property
    def size(self) -> int:
        return self.identity.size

    def needs_checksums(self, changed: FileIdentity | None) -> bool:
        """Whether this read checks the CRC32s; ``changed`` is what check_identity found."""
        return changed is not None or self.verify_every_read or not self.verified

    def accept(self, identity: FileIdentity | None) -> None:
        """After a read whose checksums matched (or were not due)."""
        self.verified = True
        if identity is not None:
            self.identity = identity

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.drop_direct()

    def drop_direct(self) -> None:
        fd, self.direct_fd = self.direct_fd, -1
        if fd >= 0:
            os.close(fd)


def window_for(plan: ReadPlan) -> Window | None:
    """The whole pages around a plan's runs, read at once where they do not lie on whole
    pages themselves and not much else lies between them (``MAX_EXTRA``); None: read per
    run ([Note: the window read] in reader.py)."""
    runs = sorted(plan.runs, key=lambda r: r.file_offset)
    if not runs or all(
        r.file_offset % PAGE == 0 and r.nbytes % PAGE == 0 and r.buf_offset % PAGE == 0
        for r in runs
    ):
        return None  # already whole pages: read as they are, O_DIRECT where possible
    start = runs[0].file_offset // PAGE * PAGE
    needed = max(r.file_offset + r.nbytes for r in runs)
    end = -(-needed // PAGE) * PAGE
    if end - start > plan.nbytes * (1 + MAX_EXTRA) + 2 * PAGE:
        return None
    return Window(start, end, needed, tuple(runs))


def open_plan(path: Path, chunks: list[Chunk], owned: bool, direct: bool = False) -> ReadPlan:
    """The plan of reading ``chunks`` from ``path`` (``direct``: with an O_DIRECT descriptor
    beside, where the filesystem allows one)."""
    backend = files()
    fd = backend.open(path)
    plan = ReadPlan(path, fd, FileIdentity.of(os.fstat(fd)), chunks, owned, files=backend)
    if direct:
        try:
            direct_fd = backend.open_direct(path)
        except ConfigError:
            plan.close()
            raise
        plan.direct_fd = -1 if direct_fd is None else direct_fd
    return plan


def check_chunk(plan: ReadPlan, chunk: Chunk, data: memoryview) -> None:
    """``data`` (the chunk's bytes, wherever they were read to) against its CRC32."""
    if zlib.crc32(data) != chunk.crc:
        raise CorruptGroupFileError(
            f"{plan.path} changed or is corrupted at byte {chunk.file_offset} (checksum "
            f"mismatch); its contents were not used. {damaged_hint(plan)}"
        )


def damaged_hint(plan: ReadPlan) -> str:
    """What happens next, in words a user of any front end can act on (no Python call)."""
    if not plan.owned:
        return "Put the original file back, or load the model again"
    return (
        "Ferry rewrites it from the model's checkpoint where the model was loaded from one; "
        "otherwise its weights are lost: load the model again"
    )


def truncated(plan: ReadPlan, short: int) -> CorruptGroupFileError:
    return CorruptGroupFileError(
        f"{plan.path} is truncated (ended {short} bytes early); its contents were not used. "
        f"{damaged_hint(plan)}"
    )


def check_identity(plan: ReadPlan) -> FileIdentity | None:
    """None when the file is as recorded; its new identity when something wrote it since
    (the caller then checks this read's checksums and, if they match, records it). A
    changed size is refused here: the file was truncated or replaced."""
    now = FileIdentity.of(os.fstat(plan.fd))
    if now == plan.identity:
        return None
    if now.size != plan.size:
        what = "group file" if plan.owned else "source checkpoint"
        raise CorruptGroupFileError(
            f"the {what} {plan.path} was modified after the offload was applied (size "
            f"{plan.size} -> {now.size}); its contents were not used. {damaged_hint(plan)}"
        )
    return now
