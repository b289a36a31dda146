"""A short read-speed probe of a disk folder, for the planner's first plan there
(planner/disk_speed.py keeps what it measured).

Bounded: it writes at most ``max_bytes`` (and no more than the folder's free space leaves
beside the disk tier's margin), stops writing or reading at ``max_seconds`` each, and reads
only what it wrote. The reads must come from the disk, not from the page cache that the writes
just filled: the file is written and read with O_DIRECT where the platform and the filesystem
take it; otherwise it is fsynced and its cached pages dropped (posix_fadvise DONTNEED) before
the read (macOS: F_NOCACHE). A platform with none of these (Windows) would time its page
cache, so it measures nothing there. It writes only inside a folder of its own under the disk
folder, marked as Ferry's (store.py's marker), and removes the file, the marker, the
folder and any folder it had to create, whatever happens.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..units import GB, MIB, fmt_bytes
from .files import drop_cached, open_uncached, pread_any
from .folder import SPACE_MARGIN
from .store import MARKER

FOLDER = "ferry-speed-probe"
MAX_BYTES = 256 * MIB
MAX_SECONDS = 2.0
CHUNK = 8 * MIB
#: Less than this to write says nothing worth keeping about a disk.
MIN_BYTES = CHUNK


@dataclass(frozen=True)
class Probe:
    """What the probe found: the read speed (None: not measured, ``why`` says why), the bytes
    it read, and whether the reads bypassed the page cache by O_DIRECT."""

    gbps: float | None
    bytes_read: int = 0
    direct: bool = False
    why: str | None = None


def probe(
    folder: str | os.PathLike[str], max_bytes: int | None = None, max_seconds: float | None = None
) -> Probe:
    """Measures ``folder``'s read speed (the module's docstring; the bounds default to
    ``MAX_BYTES`` and ``MAX_SECONDS``). Never raises for the folder's own problems
    (read-only, full, gone): the Probe says them."""
    max_bytes = MAX_BYTES if max_bytes is None else max_bytes
    max_seconds = MAX_SECONDS if max_seconds is None else max_seconds
    root = Path(folder).expanduser()
    created: list[Path] = []
    where = root / FOLDER
    try:
        created = _make_parents(root)
        room = shutil.disk_usage(root).free - SPACE_MARGIN
        size = min(max_bytes, room) // CHUNK * CHUNK
        if size < MIN_BYTES:
            return Probe(None, why=f"{root} has {fmt_bytes(max(room, 0))} free beside the margin")
        where.mkdir(exist_ok=True)
        (where / MARKER).write_text(json.dumps({"ferry": 1, "pid": os.getpid(), "state": "probe"}))
        path = where / f"probe-{os.getpid()}.bin"
        written, direct = _write(path, size, max_seconds)
        read, seconds, uncached = _read(path, written, direct, max_seconds)
    except OSError as e:
        return Probe(None, why=f"the speed probe could not use {root} ({e.strerror or e})")
    finally:
        _clean(where, created)
    if not uncached:  # the reads came from the page cache: RAM's speed, not the disk's
        return Probe(None, read, why="this platform cannot read past its page cache")
    if not read or seconds <= 0:
        return Probe(None, read, direct, why=f"the speed probe read nothing back in {root}")
    return Probe(read / seconds / GB, read, direct)


def _make_parents(root: Path) -> list[Path]:
    """Creates ``root`` where it does not exist yet; the folders created, deepest first."""
    created = []
    p = root
    while not p.exists():
        created.append(p)
        p = p.parent
    root.mkdir(parents=True, exist_ok=True)
    return created


def _buffer() -> mmap.mmap:
    """A page-aligned buffer of CHUNK bytes (O_DIRECT's alignment), filled with bytes that do
    not compress (a compressing filesystem would write less than asked)."""
    buf = mmap.mmap(-1, CHUNK)
    buf.write(os.urandom(CHUNK))
    return buf


def _write(path: Path, size: int, max_seconds: float) -> tuple[int, bool]:
    """Writes up to ``size`` bytes in ``max_seconds``; (bytes written, O_DIRECT)."""
    buf = _buffer()
    fd, direct = open_uncached(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    written = 0
    try:
        deadline = time.perf_counter() + max_seconds
        while written < size and time.perf_counter() < deadline:
            written += os.write(fd, buf)
        os.fsync(fd)
        if not direct:
            # Buffered: the written pages are in the page cache; dropped, the read is the disk's.
            drop_cached(fd)
    finally:
        os.close(fd)
        buf.close()
    return written, direct


def _read(path: Path, size: int, direct: bool, max_seconds: float) -> tuple[int, float, bool]:
    """Reads back at most ``size`` bytes in ``max_seconds``; (bytes read, seconds, whether
    the reads bypassed the page cache)."""
    buf = mmap.mmap(-1, CHUNK)
    if direct:
        fd, read_direct = open_uncached(path, os.O_RDONLY)
    else:
        fd, read_direct = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0)), False
    uncached = read_direct or drop_cached(fd)
    read = 0
    try:
        start = time.perf_counter()
        deadline = start + max_seconds
        while read < size and time.perf_counter() < deadline:
            n = pread_any(fd, buf, read)
            if n <= 0:
                break
            read += n
        seconds = time.perf_counter() - start
    finally:
        os.close(fd)
        buf.close()
    return read, seconds, uncached


def _clean(where: Path, created: list[Path]) -> None:
    """Removes the probe's file, then the marker and the folder where nothing else is in it
    (another process's probe may be), then the folders it created (empty)."""
    if where.is_dir():
        (where / f"probe-{os.getpid()}.bin").unlink(missing_ok=True)
        if [p.name for p in where.iterdir()] == [MARKER]:
            (where / MARKER).unlink(missing_ok=True)
        try:
            where.rmdir()
        except OSError:
            pass  # another probe's file, or something not the probe's: left as found
    for p in created:
        try:
            p.rmdir()
        except OSError:
            break
