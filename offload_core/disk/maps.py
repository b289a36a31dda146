"""The process's file mappings, read from /proc/self/maps: the one parser of that file.

A line is "lo-hi perms offset dev inode path"; anonymous mappings have no path or a bracketed
one ("[heap]"). Linux only: elsewhere the file is missing and there are no mappings to read.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

MAPS = Path("/proc/self/maps")
_DELETED = " (deleted)"


class FileMapping(NamedTuple):
    """One address range mapped from a file. ``deleted`` is the kernel's mark for a file
    unlinked while mapped (its pages stay valid; its path no longer names it)."""

    lo: int
    hi: int
    path: str
    deleted: bool
    #: Where in the file ``lo`` is (bytes), and the file's device and inode as the kernel
    #: names them: what says the path still names the file that was mapped.
    offset: int = 0
    dev: tuple[int, int] = (0, 0)
    inode: int = 0


def file_mappings(maps: Path = MAPS) -> list[FileMapping]:
    """The address ranges mapped from files, sorted by start; [] where /proc is not there."""
    try:
        text = maps.read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith("/"):
            continue
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        path = fields[5]
        deleted = path.endswith(_DELETED)
        major, minor = (int(x, 16) for x in fields[3].split(":"))
        out.append(
            FileMapping(
                lo,
                hi,
                path[: -len(_DELETED)] if deleted else path,
                deleted,
                int(fields[2], 16),
                (major, minor),
                int(fields[4]),
            )
        )
    return sorted(out)


def mapped_file_at(address: int, maps: Path = MAPS) -> Path | None:
    """The file mapped over ``address``; None where there is none, where it was deleted, or
    where this system has no /proc (macOS, the BSDs)."""
    for m in file_mappings(maps):
        if m.lo <= address < m.hi:
            return None if m.deleted else Path(m.path)
    return None
