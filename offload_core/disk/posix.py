"""The file backend for POSIX systems (Linux, the BSDs, macOS): ``os.preadv``, O_DIRECT where
the OS has it, ``madvise`` where it has Linux's semantics, and the open-file limit through
``resource``. Anything a platform lacks here degrades (buffered reads, no mapped groups, no
huge pages, no limit raised), never raises."""

from __future__ import annotations

import errno
import logging
import mmap
import os
import sys
from pathlib import Path

from ..errors import ConfigError
from .maps import mapped_file_at

log = logging.getLogger("ferry")

OUT_OF_DESCRIPTORS = (
    "this offload needs more open files than the process may hold (ulimit -n); choose block "
    "level (fewer, larger groups) or raise the limit (ulimit -n 65536)"
)


#: From <linux/mman.h>; Python exposes them only when built against headers that have them.
#: POPULATE_READ faults a range in now (reading it from the disk) without touching it from
#: user space, POPULATE_WRITE takes its pages now (Linux 5.14+; older kernels answer EINVAL).
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)


class PosixFiles:
    def __init__(self) -> None:
        self.has_direct = hasattr(os, "O_DIRECT")
        linux = sys.platform.startswith("linux")
        # Mapped groups need DONTNEED to drop the pages at once (Linux's semantics; macOS's
        # is only a hint) and madvise at all (some builds lack it).
        self.maps_groups = linux and hasattr(mmap, "MADV_DONTNEED") and _has_madvise()
        self.huge_pages = linux and hasattr(mmap, "MADV_HUGEPAGE") and _thp_allowed()
        self.name = "os.preadv" + (
            ", O_DIRECT where the filesystem allows" if self.has_direct else ", buffered"
        )

    def open(self, path: Path) -> int:
        return open_descriptor(path, os.O_RDONLY)

    def open_direct(self, path: Path) -> int | None:
        if not self.has_direct:
            return None
        try:
            return open_descriptor(path, os.O_RDONLY | os.O_DIRECT)
        except ConfigError:
            raise
        except OSError:
            return None  # tmpfs and some network filesystems refuse O_DIRECT: buffered reads

    def pread(self, fd: int, into: memoryview, offset: int) -> int:
        return os.preadv(fd, [into], offset)

    def pread_direct(self, fd: int, into: memoryview, offset: int) -> int | None:
        try:
            return os.preadv(fd, [into], offset)
        except OSError as e:
            if e.errno == errno.EINVAL:
                return None  # this filesystem, offset or buffer will not do direct I/O
            raise

    def reserve_descriptors(self, count: int) -> None:
        """Every disk-tier group holds up to three descriptors (a leaf-level offload of a large
        model has hundreds of groups, and many desktops start programs with a soft limit of
        1024). Raises the soft limit up to the hard one if needed; past the hard limit, a
        clear error, before anything is written."""
        try:
            import resource
        except ImportError:  # no such limit to raise
            return
        in_use = _open_descriptors()
        if in_use is None:
            return  # no cheap count here: the open itself says it if it fails
        want = in_use + count + 64  # headroom: a group file being written, the user's own
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY or want <= soft:
            return
        if hard != resource.RLIM_INFINITY and want > hard:
            raise ConfigError("level", OUT_OF_DESCRIPTORS + f" (needs {want}, the limit is {hard})")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        log.info("ferry: raised the open-file limit from %d to %d for the disk tier", soft, want)

    def advise_huge(self, mapping: mmap.mmap, start: int, length: int) -> None:
        if not self.huge_pages:
            return
        for advice in (mmap.MADV_HUGEPAGE, MADV_POPULATE_WRITE):
            try:
                mapping.madvise(advice, start, length)
            except OSError:
                # Refused (a kernel before 5.14 has no populate): the pages are taken as the
                # first read touches them, huge where the advice held.
                pass

    def populate(self, mapping: mmap.mmap, length: int) -> None:
        try:
            mapping.madvise(MADV_POPULATE_READ, 0, length)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            mapping.madvise(mmap.MADV_WILLNEED, 0, length)  # a kernel before 5.14: async

    def mapped_file(self, address: int) -> Path | None:
        return mapped_file_at(address)

    def drop_pages(self, mapping: mmap.mmap, length: int) -> None:
        mapping.madvise(mmap.MADV_DONTNEED, 0, length)


def _open_descriptors() -> int | None:
    """How many descriptors this process holds: /proc on Linux, /dev/fd on macOS and the
    BSDs (a listing of the caller's own); None where neither answers."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder))
        except OSError:
            continue
    return None


def _has_madvise() -> bool:
    try:
        with mmap.mmap(-1, mmap.PAGESIZE) as probe:
            probe.madvise(mmap.MADV_DONTNEED, 0, mmap.PAGESIZE)
    except (AttributeError, OSError, ValueError):
        return False
    return True


def _thp_allowed() -> bool:
    """Transparent huge pages set to ``always`` or ``madvise`` (the usual Linux default)."""
    try:
        setting = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    return "[never]" not in setting


def open_descriptor(path: Path, flags: int) -> int:
    """``os.open``, with a clear error where the process is out of descriptors (the disk
    tier reserves what it needs before writing anything: ``reserve_descriptors``)."""
    try:
        return os.open(path, flags)
    except OSError as e:
        if e.errno != errno.EMFILE:
            raise
        raise ConfigError("level", OUT_OF_DESCRIPTORS) from None


# File locks for the shared RAM tier (disk/shared_segments.py): flock locks belong to the open
# file, so the kernel drops them when their process dies, killed with -9 too. That is the
# holder count that outlives a crash. Windows has no flock: the shared tier refuses there.


def lock(fd: int, exclusive: bool, wait: bool = True) -> bool:
    """An flock on ``fd``; False where ``wait`` is off and another open file holds a
    conflicting one."""
    import fcntl

    flags = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if wait else fcntl.LOCK_NB)
    try:
        fcntl.flock(fd, flags)
    except BlockingIOError:
        return False
    return True


def unlock(fd: int) -> None:
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_UN)
