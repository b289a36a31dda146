"""The file backend for a Python without ``os.preadv`` (Windows' CPython has neither it nor
``os.pread``; a macOS build may lack it): positioned reads as a seek and a ``readinto``
under a lock of the descriptor's own, so threads that share a descriptor never move its
position under each other's read. No unbuffered reads, no mapped groups, no huge pages;
nothing here raises for what the platform lacks.

[Note: positioned reads without pread]
A descriptor has one file position, shared by every thread that reads it: the disk tier's
load thread, the pool that reads checked chunks, and the checkpoint index's tensor reads on
the caller's thread. ``pread`` takes the offset with the read, so they never meet; here a
read is ``lseek`` then ``readinto``, and the two must not interleave with another thread's
pair, so each descriptor has a lock held across both. Reads of different files (different
groups) still overlap each other and the compute: ``FileIO.readinto`` releases the GIL while
the OS reads. Reads of one file are serialised, which costs nothing on the load thread (it
reads one group file after another) and is measured for the chunk pool in docs/
benchmarks.md ("Portable reads").

What this backend cannot do that Windows could: ``ReadFile`` with an OVERLAPPED offset
(positioned, no lock) and ``FILE_FLAG_NO_BUFFERING`` (the page cache bypassed) need a Win32
handle opened with ``CreateFileW`` through ctypes; neither can run on the Linux machines
Ferry is tested on, so neither is here.
"""

from __future__ import annotations

import io
import mmap
import os
import sys
import threading
from pathlib import Path

from ..errors import ConfigError
from .posix import OUT_OF_DESCRIPTORS, open_descriptor

#: The C runtime's cap on descriptors from ``os.open`` on Windows (the UCRT's low-level I/O).
WINDOWS_CRT_FILES = 8192


class PortableFiles:
    name = "positioned reads as seek + readinto under a per-file lock (no os.preadv here), buffered"
    has_direct = False
    maps_groups = False
    huge_pages = False

    def __init__(self) -> None:
        self._locks: dict[int, threading.Lock] = {}
        self._guard = threading.Lock()

    def open(self, path: Path) -> int:
        # O_BINARY: Windows' C runtime opens in text mode otherwise (and would turn CR LF
        # into LF in the middle of a tensor). Elsewhere it is 0.
        return open_descriptor(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))

    def open_direct(self, path: Path) -> int | None:
        return None

    def pread(self, fd: int, into: memoryview, offset: int) -> int:
        """See [Note: positioned reads without pread]."""
        with self._lock(fd):
            os.lseek(fd, offset, os.SEEK_SET)
            with io.FileIO(fd, "rb", closefd=False) as f:
                return f.readinto(into) or 0

    def pread_direct(self, fd: int, into: memoryview, offset: int) -> int | None:
        return None  # never asked: open_direct gives no descriptor

    def reserve_descriptors(self, count: int) -> None:
        """Windows caps ``os.open``'s descriptors at 8192 a process, and has no soft limit to
        raise; elsewhere the open itself says so if the process runs out."""
        if sys.platform == "win32" and count + 64 > WINDOWS_CRT_FILES:
            raise ConfigError(
                "level",
                OUT_OF_DESCRIPTORS.split("; ")[0]
                + f" (needs {count + 64}, Windows allows {WINDOWS_CRT_FILES}); choose block "
                "level (fewer, larger groups)",
            )

    def advise_huge(self, mapping: mmap.mmap, start: int, length: int) -> None:
        return None  # no huge pages asked for: ordinary pages

    def populate(self, mapping: mmap.mmap, length: int) -> None:
        raise NotImplementedError("mapped groups are not offered here (maps_groups is False)")

    def drop_pages(self, mapping: mmap.mmap, length: int) -> None:
        raise NotImplementedError("mapped groups are not offered here (maps_groups is False)")

    def mapped_file(self, address: int) -> Path | None:
        return None  # no /proc/self/maps: the disk tier writes the groups instead

    def _lock(self, fd: int) -> threading.Lock:
        lock = self._locks.get(fd)
        if lock is None:
            with self._guard:
                lock = self._locks.setdefault(fd, threading.Lock())
        return lock
