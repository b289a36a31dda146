"""Reading a group's bytes from a file, checked: its chunks, the file's identity, preadv.

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
tensor in the user's checkpoint). How fast O_DIRECT is depends on where it lands:
[Note: where a direct read lands] (transfer/host_memory.py).
"""

from __future__ import annotations

import errno
import logging
import os
import zlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..errors import ConfigError, CorruptGroupFileError
from ..units import GIB, PAGE

if TYPE_CHECKING:
    from .window_read import Window

log = logging.getLogger("ferry")

#: Checksums are kept per chunk of this many bytes (and checked reads issued per chunk).
CHUNK = 16 << 20
#: An unchecked read joins contiguous chunks into requests of at most this many bytes.
RUN = GIB


@dataclass(frozen=True)
class Chunk:
    """``nbytes`` at ``file_offset`` land at ``buf_offset`` of the group's slab."""

    file_offset: int
    buf_offset: int
    nbytes: int
    crc: int


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
        """The whole pages around this plan's runs, read at once where they do not lie on
        whole pages themselves ([Note: the window read]); None: read per run."""
        from .window_read import window_for  # window_read builds on this module

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


def bytes_view(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU uint8 tensor, without a copy."""
    return memoryview(t.numpy()).cast("B")  # type: ignore[arg-type]


def open_plan(path: Path, chunks: list[Chunk], owned: bool, direct: bool = False) -> ReadPlan:
    fd = open_descriptor(path, os.O_RDONLY)
    plan = ReadPlan(path, fd, FileIdentity.of(os.fstat(fd)), chunks, owned)
    if direct and hasattr(os, "O_DIRECT"):
        try:
            plan.direct_fd = open_descriptor(path, os.O_RDONLY | os.O_DIRECT)
        except ConfigError:
            plan.close()
            raise
        except OSError:
            pass  # tmpfs and some network filesystems refuse O_DIRECT: buffered reads
    return plan


def open_descriptor(path: Path, flags: int) -> int:
    """``os.open``, with a clear error where the process is out of descriptors (the disk
    tier reserves what it needs before writing anything: ``reserve_descriptors``)."""
    try:
        return os.open(path, flags)
    except OSError as e:
        if e.errno != errno.EMFILE:
            raise
        raise ConfigError("level", _OUT_OF_DESCRIPTORS) from None


_OUT_OF_DESCRIPTORS = (
    "this offload needs more open files than the process may hold (ulimit -n); choose block "
    "level (fewer, larger groups) or raise the limit (ulimit -n 65536)"
)


def reserve_descriptors(count: int) -> None:
    """Makes room for ``count`` more open files: every disk-tier group holds up to three (a
    leaf-level offload of a large model has hundreds of groups, and many desktops start
    programs with a soft limit of 1024). Raises the soft limit up to the hard one if needed;
    past the hard limit, a clear error, before anything is written."""
    try:
        import resource
    except ImportError:  # Windows: no such limit to raise
        return
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        return  # not Linux: no cheap count; the open itself says it if it fails
    want = in_use + count + 64  # headroom: a group file being written, the user's own
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or want <= soft:
        return
    if hard != resource.RLIM_INFINITY and want > hard:
        raise ConfigError("level", _OUT_OF_DESCRIPTORS + f" (needs {want}, the limit is {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    log.info("ferry: raised the open-file limit from %d to %d for the disk tier", soft, want)


def _aligned(*values: int) -> bool:
    return all(v % PAGE == 0 for v in values)


def read_chunk(plan: ReadPlan, chunk: Chunk, buf: torch.Tensor, verify: bool = True) -> None:
    """Reads one chunk into ``buf`` at its offset and, with ``verify``, checks its CRC32.
    Runs on a worker thread (``os.preadv`` releases the GIL, so reads overlap compute)."""
    mv = bytes_view(buf)[chunk.buf_offset : chunk.buf_offset + chunk.nbytes]
    got = 0
    direct = plan.direct_fd
    if direct >= 0 and not _aligned(
        chunk.file_offset, chunk.nbytes, buf.data_ptr() + chunk.buf_offset
    ):
        direct = -1
    while got < chunk.nbytes:
        if direct >= 0:
            try:
                n = os.preadv(direct, [mv[got:]], chunk.file_offset + got)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                direct = -1  # this filesystem or offset will not do direct I/O
                continue
            if n % PAGE:
                direct = -1  # a short read ends unaligned: finish buffered
        else:
            n = os.preadv(plan.fd, [mv[got:]], chunk.file_offset + got)
        if n == 0:
            raise CorruptGroupFileError(
                f"{plan.path} is truncated (ended {chunk.nbytes - got} bytes early); its "
                f"contents were not used. {damaged_hint(plan)}"
            )
        got += n
    if verify:
        check_chunk(plan, chunk, mv)


def read_all(plan: ReadPlan, buf: torch.Tensor) -> None:
    """Every chunk into ``buf``, checked, on the calling thread (restore, first checks)."""
    for c in plan.chunks:
        read_chunk(plan, c, buf)


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
