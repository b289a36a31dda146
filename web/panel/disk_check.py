"""The disk-folder field's live check, as the user types: offload_core's read-only check
(the same one the ComfyUI node runs), shown with a tick or a cross.

Read-only by design: it never creates, writes or deletes anything, so typing a path in the
panel cannot touch the disk.
"""

from __future__ import annotations

from ...offload_core.disk.folder import FolderCheck, check_disk_folder


def check_disk_path(text: str | None, needed_bytes: int | None) -> FolderCheck:
    """What the folder ``text`` would do as the disk tier for ``needed_bytes`` of groups."""
    return check_disk_folder(text, needed_bytes)


def markdown(check: FolderCheck) -> str:
    """One line for the page: a failure names the setting, as every panel error does."""
    return f"✔ {check.message}" if check.ok else f"✖ disk_path: {check.message}"
