"""The platform's file and mapping calls, behind one small interface: the only place Ferry
opens a file for unbuffered reading, issues a positioned read, advises the kernel about a
mapping (huge pages, faulting pages in, dropping them) or raises the open-file limit.

A backend is one file: posix.py (``os.preadv``, O_DIRECT, ``madvise`` and ``resource``
where the OS has them: Linux, the BSDs, macOS) and portable.py (positioned reads without
``os.preadv``: Windows, and any Python built without it). ``files()`` picks the one for
this platform once; the disk tier names it in its plan's notes. The reader (reader.py), the
read plans (plan.py), the host buffers (host_memory.py), the mapped groups (sources/
mapped.py) and the checkpoint index (sources/checkpoint.py) call nothing else;
tests/test_platform_calls.py checks that no other module calls a platform-specific function.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol


class FileBackend(Protocol):
    """Positioned reads on descriptors (buffered and unbuffered) and advice on mappings."""

    #: What the disk tier's notes call it ("os.preadv, O_DIRECT where the filesystem allows").
    name: str
    #: Whether ``open_direct`` can ever give a descriptor here.
    has_direct: bool
    #: Whether a group file's mapping can drop its pages at once and fault them in on a
    #: reader thread (disk/mapped.py: the CPU's mapped path needs both).
    maps_groups: bool
    #: Whether a large host buffer can be asked for on transparent huge pages.
    huge_pages: bool

    def open(self, path: Path) -> int:
        """A read-only binary descriptor; ConfigError("level") where the process is out of
        them."""
        ...

    def open_direct(self, path: Path) -> int | None:
        """A read-only descriptor that bypasses the page cache; None where the platform or
        the filesystem refuses it (tmpfs, some network filesystems)."""
        ...

    def pread(self, fd: int, into: memoryview, offset: int) -> int:
        """Up to ``len(into)`` bytes at ``offset`` (0: the file's end). Threads may share
        ``fd``; the read releases the GIL."""
        ...

    def pread_direct(self, fd: int, into: memoryview, offset: int) -> int | None:
        """``pread`` on a direct descriptor: ``offset``, ``len(into)`` and the address are
        whole pages. None where this file or buffer refuses it (read buffered instead)."""
        ...

    def reserve_descriptors(self, count: int) -> None:
        """Makes room for ``count`` more open files, or a clear ConfigError("level")."""
        ...

    def advise_huge(self, mapping: mmap.mmap, start: int, length: int) -> None:
        """Asks for huge pages under ``mapping[start:start + length]`` and takes them at
        once where the kernel can; silently nothing where it cannot."""
        ...

    def populate(self, mapping: mmap.mmap, length: int) -> None:
        """Faults ``mapping``'s first ``length`` bytes in (a read from the disk, on the
        calling thread). OSError EFAULT where a page cannot be read (the file ends first,
        an I/O error). Only where ``maps_groups``."""
        ...

    def drop_pages(self, mapping: mmap.mmap, length: int) -> None:
        """Drops the process's pages of ``mapping``'s first ``length`` bytes (a later touch
        reads them again from the file). Only where ``maps_groups``."""
        ...

    def mapped_file(self, address: int) -> Path | None:
        """The file whose mapping in this process holds ``address`` (a loader's weights
        that are views of the file it mapped: ComfyUI-GGUF's); None for other memory, or
        where the platform cannot say."""
        ...


_chosen: list[FileBackend] = []


def platform_backend() -> FileBackend:
    """The backend this Python can run: ``os.preadv`` decides (Windows' Python has neither
    it nor ``os.pread``; a macOS build may lack it)."""
    if hasattr(os, "preadv"):
        from .posix import PosixFiles

        return PosixFiles()
    from .portable import PortableFiles

    return PortableFiles()


def files() -> FileBackend:
    """This platform's backend (or the one ``using`` put in place)."""
    if not _chosen:
        _chosen.append(platform_backend())
    return _chosen[-1]


@contextmanager
def using(backend: FileBackend) -> Iterator[FileBackend]:
    """Every file call inside the block goes to ``backend`` (tests and benchmarks; a
    platform's backend is chosen in ``files`` instead)."""
    files()
    _chosen.append(backend)
    try:
        yield backend
    finally:
        _chosen.remove(backend)


# The speed probe's file primitives (disk/speed_probe.py): feature-tested at call time, for a
# descriptor the probe opens itself to write and read back past the page cache.


def open_uncached(path: Path, flags: int) -> tuple[int, bool]:
    """(descriptor, whether direct): ``path`` opened with O_DIRECT where the platform and the
    filesystem take it (tmpfs and some network filesystems refuse it), else without."""
    direct = getattr(os, "O_DIRECT", 0)
    flags |= getattr(os, "O_BINARY", 0)  # Windows: no newline translation
    if direct:
        try:
            return os.open(path, flags | direct, 0o600), True
        except OSError:
            pass
    return os.open(path, flags, 0o600), False


def drop_cached(fd: int) -> bool:
    """Keeps the reads of ``fd`` off the page cache where O_DIRECT could not: its cached
    pages dropped (posix_fadvise, Linux and the BSDs), or caching off (macOS's F_NOCACHE,
    whose cache the fsync'd writes may still hold: a fresh read of the rest is the disk's).
    False where the platform has neither (Windows)."""
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    try:
        import fcntl
    except ImportError:
        return False
    nocache = getattr(fcntl, "F_NOCACHE", None)
    if nocache is None:
        return False
    fcntl.fcntl(fd, nocache, 1)
    return True


def pread_any(fd: int, buf: mmap.mmap, offset: int) -> int:
    """A positioned read into ``buf`` on any platform (Windows: seek and read)."""
    if hasattr(os, "preadv"):
        return os.preadv(fd, [buf], offset)
    os.lseek(fd, offset, os.SEEK_SET)  # Windows: no preadv
    return len(os.read(fd, len(buf)))
