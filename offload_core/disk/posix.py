"""The file backend for POSIX systems (Linux, the BSDs, macOS): ``os.preadv``, O_DIRECT where
the OS has it, and the open-file limit through ``resource``."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from ..errors import ConfigError

log = logging.getLogger("ferry")

OUT_OF_DESCRIPTORS = (
    "this offload needs more open files than the process may hold (ulimit -n); choose block "
    "level (fewer, larger groups) or raise the limit (ulimit -n 65536)"
)


class PosixFiles:
    has_direct = hasattr(os, "O_DIRECT")

    def open(self, path: Path) -> int:
        return _open(path, os.O_RDONLY)

    def open_direct(self, path: Path) -> int | None:
        if not self.has_direct:
            return None
        try:
            return _open(path, os.O_RDONLY | os.O_DIRECT)
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
        try:
            in_use = len(os.listdir("/proc/self/fd"))
        except OSError:
            return  # not Linux: no cheap count; the open itself says it if it fails
        want = in_use + count + 64  # headroom: a group file being written, the user's own
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY or want <= soft:
            return
        if hard != resource.RLIM_INFINITY and want > hard:
            raise ConfigError("level", OUT_OF_DESCRIPTORS + f" (needs {want}, the limit is {hard})")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        log.info("ferry: raised the open-file limit from %d to %d for the disk tier", soft, want)


def _open(path: Path, flags: int) -> int:
    """``os.open``, with a clear error where the process is out of descriptors (the disk
    tier reserves what it needs before writing anything: ``reserve_descriptors``)."""
    try:
        return os.open(path, flags)
    except OSError as e:
        if e.errno != errno.EMFILE:
            raise
        raise ConfigError("level", OUT_OF_DESCRIPTORS) from None
