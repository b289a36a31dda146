"""The disk tier's folder: made usable before anything is written, or a clear error.

The checks run in order and each names ``disk_path``: not a file, creatable, writable (a real
write: permissions can lie on read-only mounts and ACLs), and room for the group files plus
``SPACE_MARGIN`` (so Ferry never fills a disk to the last byte).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..errors import DiskPathError

#: Free space kept beside the group files, so Ferry never fills a disk to the last byte.
SPACE_MARGIN = 64 << 20


def make_root(disk_path: str) -> tuple[Path, list[Path]]:
    """Creates ``disk_path`` if needed; returns it and the folders this call created (removed
    again on delete if left empty)."""
    root = Path(disk_path).expanduser()
    if root.exists() and not root.is_dir():
        raise DiskPathError("disk_path", f"{root} is a file; give a folder for the disk tier")
    created = []
    probe_dir = root
    while not probe_dir.exists():
        created.append(probe_dir)
        probe_dir = probe_dir.parent
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DiskPathError(
            "disk_path", f"cannot create {root} ({e.strerror}); choose a folder you can write"
        ) from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise DiskPathError(
            "disk_path", f"{root} is read-only for this user; choose a writable folder"
        )
    return root, created


def check_room(root: Path, need_bytes: int, reclaim: int) -> None:
    """Room for ``need_bytes`` of group files, counting ``reclaim`` bytes of Ferry's own old
    files that will be replaced."""
    free = shutil.disk_usage(root).free + reclaim
    if free < need_bytes + SPACE_MARGIN:
        raise DiskPathError(
            "disk_path",
            f"{root} has {free / 2**30:.2f} GB free but the offloaded groups need "
            f"{need_bytes / 2**30:.2f} GB (+{SPACE_MARGIN >> 20} MB margin); free space or "
            "choose a disk_path on a larger drive",
        )


def make_folder(root: Path, folder: Path) -> None:
    """Creates Ferry's own folder under ``root`` and proves it writable with a real write."""
    try:
        folder.mkdir(exist_ok=True)
        probe = folder / ".ferry-probe"
        probe.write_bytes(b"x")
        probe.unlink()
    except OSError as e:
        raise DiskPathError(
            "disk_path", f"cannot write in {root} ({e.strerror}); choose a writable folder"
        ) from None
