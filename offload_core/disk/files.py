"""The platform's file calls, behind one small interface: the only place Ferry opens a file
for reading with O_DIRECT, issues a positioned read, or raises the open-file limit.

A backend is one file (posix.py); ``files()`` picks the one for this platform. The reader
(reader.py), the read plans (plan.py) and the checkpoint index (sources/checkpoint.py) call
nothing else to read a file.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol


class FileBackend(Protocol):
    """Positioned reads on descriptors, buffered and unbuffered (direct)."""

    #: Whether ``open_direct`` can ever give a descriptor here.
    has_direct: bool

    def open(self, path: Path) -> int:
        """A read-only descriptor; ConfigError("level") where the process is out of them."""
        ...

    def open_direct(self, path: Path) -> int | None:
        """A read-only descriptor that bypasses the page cache (O_DIRECT); None where the
        filesystem refuses it (tmpfs, some network filesystems)."""
        ...

    def pread(self, fd: int, into: memoryview, offset: int) -> int:
        """Up to ``len(into)`` bytes at ``offset`` (0: the file's end). No shared file
        position, so threads share ``fd``; releases the GIL while it reads."""
        ...

    def pread_direct(self, fd: int, into: memoryview, offset: int) -> int | None:
        """``pread`` on a direct descriptor: ``offset``, ``len(into)`` and the address are
        whole pages. None where this file or buffer refuses it (read buffered instead)."""
        ...

    def reserve_descriptors(self, count: int) -> None:
        """Makes room for ``count`` more open files, or a clear ConfigError("level")."""
        ...


_chosen: list[FileBackend] = []


def files() -> FileBackend:
    """This platform's backend (or the one ``using`` put in place)."""
    if not _chosen:
        from .posix import PosixFiles

        _chosen.append(PosixFiles())
    return _chosen[-1]


@contextmanager
def using(backend: FileBackend) -> Iterator[FileBackend]:
    """Every file call inside the block goes to ``backend`` (tests; a platform's backend
    is chosen in ``files`` instead)."""
    files()
    _chosen.append(backend)
    try:
        yield backend
    finally:
        _chosen.remove(backend)
