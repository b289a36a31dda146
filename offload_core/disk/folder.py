"""The disk tier's folder: checked read-only as it is typed, made usable before anything is
written, or a clear error.

The checks run in order and each names ``disk_path``: not a file, creatable, writable (a real
write: permissions can lie on read-only mounts and ACLs), and room for the group files plus
``SPACE_MARGIN`` (so Ferry never fills a disk to the last byte); a layout that writes no group
file (every group read from its own file in place) needs no room.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DiskPathError
from ..policy import parse_disk_path
from ..units import fmt_bytes

#: Free space kept beside the group files, so Ferry never fills a disk to the last byte.
SPACE_MARGIN = 64 << 20


def room_needed(written: int) -> int:
    """Free bytes a folder needs for ``written`` bytes of group files: those and the margin,
    or none where nothing is written. The run's checks and the planner's (planner/tiers.py)
    both ask this, so a plan that fits is not refused by the run."""
    return written + SPACE_MARGIN if written > 0 else 0


#: Windows' classic path limit (MAX_PATH, 260 with the final NUL), and what Ferry adds under
#: the folder at most: "\\ferry-" + a 60-character slug + "-999\\group-00000.safetensors.tmp".
WINDOWS_MAX_PATH = 259
FERRY_SUFFIX = 100


def long_path(path: str, windows: bool = sys.platform == "win32", flavour: Any = os.path) -> str:
    r"""``path``, in Windows' extended-length form (``\\?\C:\...``, ``\\?\UNC\server\share\...``)
    where the group files under it could pass MAX_PATH: without it, Windows refuses such a
    path unless long paths are switched on machine-wide. Unchanged elsewhere."""
    if not windows or path.startswith("\\\\?\\"):
        return path
    full = flavour.normpath(flavour.abspath(path))
    if len(full) + FERRY_SUFFIX <= WINDOWS_MAX_PATH:
        return path
    if full.startswith("\\\\"):  # \\server\share\...: a UNC path
        return "\\\\?\\UNC\\" + full[2:]
    return "\\\\?\\" + full


def make_root(disk_path: str) -> tuple[Path, list[Path]]:
    """Creates ``disk_path`` if needed; returns it and the folders this call created (removed
    again on delete if left empty)."""
    root = Path(long_path(os.path.expanduser(disk_path)))
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
    if free < room_needed(need_bytes):
        raise DiskPathError(
            "disk_path",
            f"{root} has {fmt_bytes(free)} free but the offloaded groups need "
            f"{fmt_bytes(need_bytes)} (+{fmt_bytes(SPACE_MARGIN)} margin); free space or "
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


# ---- The read-only check ---------------------------------------------------------------------
# The node (before a prompt is queued) and the panel (as the user types) both ask this one
# function, so a folder gets the same verdict and the same words in both. It only stats and
# asks access(): it never creates, writes or deletes anything. The applying path above keeps
# its own create + real-write probe, because access() can be wrong (ACLs, some network mounts).


@dataclass(frozen=True)
class FolderCheck:
    """What a folder would do as the disk tier. ``message`` is for the user either way."""

    ok: bool
    message: str
    path: Path | None = None
    free_bytes: int | None = None
    needed_bytes: int | None = None

    def error(self) -> DiskPathError:
        return DiskPathError("disk_path", self.message)

    def raise_if_bad(self) -> Path:
        """The folder, or DiskPathError naming ``disk_path`` with the check's message."""
        if not self.ok or self.path is None:
            raise self.error()
        return self.path


def check_disk_folder(text: str | None, needed_bytes: int | None = None) -> FolderCheck:
    """Checks ``text`` as the disk tier's folder for ``needed_bytes`` of group files (plus
    ``SPACE_MARGIN``): a full path, a folder or creatable, writable, roomy. Read-only."""
    try:
        path = Path(parse_disk_path(text)).expanduser()  # the setting's one parser first
    except ConfigError as e:
        return FolderCheck(False, str(e).removeprefix(f"{e.setting}: "))
    try:
        problem, anchor = _why_unusable(path)
        if problem:
            return FolderCheck(False, problem, path)
        free = shutil.disk_usage(anchor).free
    except (OSError, ValueError) as e:  # ValueError: a path the OS cannot represent
        return FolderCheck(False, f"not a usable path ({e})")
    return _room_verdict(path, free, needed_bytes)


def _why_unusable(path: Path) -> tuple[str | None, Path]:
    """Why ``path`` cannot hold Ferry's folder (None if it can), and the nearest existing
    folder: the one that must be writable to create the rest."""
    exists = path.exists()
    if exists and not path.is_dir():
        return f"{path} is a file, not a folder", path
    anchor = path
    while not anchor.exists() and anchor.parent != anchor:
        anchor = anchor.parent
    if not anchor.is_dir():
        return f"{anchor} is a file, so {path} cannot be created", anchor
    # access() also answers EROFS for a read-only mount, even to root.
    if not os.access(anchor, os.W_OK | os.X_OK):
        if exists:
            return f"{path} is not writable", anchor
        return f"{path} cannot be created ({anchor} is not writable)", anchor
    return None, anchor


def _room_verdict(path: Path, free: int, needed: int | None) -> FolderCheck:
    state = "exists and is writable" if path.exists() else "will be created"
    if needed is None:
        return FolderCheck(True, f"{path} {state}; {fmt_bytes(free)} free", path, free)
    if free < room_needed(needed):
        return FolderCheck(
            False,
            f"{path} has {fmt_bytes(free)} free, the offloaded groups need {fmt_bytes(needed)} "
            f"(+{fmt_bytes(SPACE_MARGIN)} margin); pick a folder on a disk with more room",
            path,
            free,
            needed,
        )
    return FolderCheck(
        True,
        f"{path} {state}; {fmt_bytes(free)} free, the offloaded groups need {fmt_bytes(needed)}",
        path,
        free,
        needed,
    )
