"""Checks the disk tier's folder as the user types it: exists or creatable, writable, roomy.

Read-only by design: it stats and asks access(); it never creates, writes or deletes
anything, so typing a path in the panel cannot touch the disk.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

GB = 1 << 30


@dataclass(frozen=True)
class DiskCheck:
    ok: bool
    message: str
    free_bytes: int | None = None
    needed_bytes: int | None = None

    def markdown(self) -> str:
        return ("✔ " if self.ok else "✖ ") + self.message


def _gb(n: int) -> str:
    # Small test models would all read "0.00 GB".
    return f"{n / GB:.2f} GB" if n >= GB // 10 else f"{n / (1 << 20):.1f} MB"


def check_disk_path(text: str | None, needed_bytes: int | None) -> DiskCheck:
    """What the folder ``text`` would do as the disk tier for a model needing ``needed_bytes``."""
    raw = (text or "").strip()
    if not raw:
        return DiskCheck(
            False, "disk_path: type a folder on a fast disk (an SSD/NVMe), e.g. /mnt/nvme/ferry"
        )
    if "\x00" in raw:
        # Path.exists() answers False for a NUL byte instead of failing: catch it here.
        return DiskCheck(False, "disk_path: not a usable path (it contains a NUL character)")
    try:
        path = Path(raw).expanduser()
        if not path.is_absolute():
            return DiskCheck(
                False, f"disk_path: use a full path (starting with / or a drive), not {raw!r}"
            )
        exists = path.exists()
        if exists and not path.is_dir():
            return DiskCheck(False, f"disk_path: {path} is a file, not a folder")
        # The nearest folder that exists is the one that must be writable (to create the rest).
        anchor = path
        while not anchor.exists():
            if anchor.parent == anchor:
                break
            anchor = anchor.parent
        if not anchor.is_dir():
            return DiskCheck(False, f"disk_path: {anchor} is a file, so {path} cannot be created")
        if not os.access(anchor, os.W_OK | os.X_OK):
            what = "is not writable" if exists else f"cannot be created ({anchor} is not writable)"
            return DiskCheck(False, f"disk_path: {path} {what}")
        free = shutil.disk_usage(anchor).free
    except (OSError, ValueError) as e:  # ValueError: an embedded NUL byte
        return DiskCheck(False, f"disk_path: not a usable path ({e})")
    state = "exists and is writable" if exists else "will be created"
    if needed_bytes is None:
        return DiskCheck(True, f"{path} {state}; {_gb(free)} free", free, None)
    if free < needed_bytes:
        return DiskCheck(
            False,
            f"disk_path: {path} has {_gb(free)} free, the model needs {_gb(needed_bytes)}; "
            "pick a disk with more room",
            free,
            needed_bytes,
        )
    return DiskCheck(
        True,
        f"{path} {state}; {_gb(free)} free, the model needs {_gb(needed_bytes)}",
        free,
        needed_bytes,
    )
