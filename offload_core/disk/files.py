"""The platform's file calls, behind one small interface: the only place Ferry opens a file
for reading with O_DIRECT, issues a positioned read, or raises the open-file limit.

A backend is one file (posix.py); ``files()`` picks the one for this platform. The reader
(reader.py), the read plans (plan.py) and the checkpoint index (sources/checkpoint.py) call
nothing else to read a file.
"""

from __future__ import annotations

import functools
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


@functools.cache
def files() -> FileBackend:
    """This platform's backend."""
    from .posix import PosixFiles

    return PosixFiles()
