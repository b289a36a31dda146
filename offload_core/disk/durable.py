"""Writing a file so that a crash, a full disk or a power cut never leaves half of it: the one
atomic write and the one folder fsync behind Ferry's group files and their folder's marker
(disk/store.py), the quantized cache (quant/cache.py) and the settings file
(tools/settings_file.py).

The bytes go to a temporary file in the target's folder, which is flushed and fsynced, then
renamed over the target (``os.replace``: a reader sees the old file or the whole new one), and
the folder is fsynced so the rename itself survives a power cut. Any error removes the
temporary file (only it: nothing else is touched) and is raised.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """Makes the renames done in ``folder`` durable. Windows opens no folder as a file (a
    PermissionError): there the rename is the filesystem's to keep. Any other error, opening
    or fsyncing, is raised: a folder Ferry writes in that cannot be synced is not passed over
    in silence."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except PermissionError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_write(
    path: str | os.PathLike[str],
    *,
    tmp: str | os.PathLike[str] | None = None,
    before_replace: Callable[[], None] | None = None,
    sync_folder: bool = True,
    mode: int = 0o666,
) -> Iterator[BinaryIO]:
    """Yields a binary file open on a temporary name beside ``path``; when the block ends
    without an error the file is flushed, fsynced and closed, ``before_replace`` runs (to let
    go of what this process holds of the old file: Windows refuses to replace a file that is
    open or mapped), the file is renamed over ``path``, and with ``sync_folder`` the folder is
    fsynced (``fsync_dir``). ``tmp``: the temporary file's name (overwritten if there); by
    default a fresh ``.<name>.<pid>.<random>.tmp`` no other writer uses. ``mode``: the new
    file's permissions (before the umask)."""
    target = Path(path)
    if tmp is None:
        temp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        flags = os.O_CREAT | os.O_EXCL
    else:
        temp = Path(tmp)
        flags = os.O_CREAT | os.O_TRUNC
    fd = os.open(temp, flags | os.O_WRONLY | getattr(os, "O_BINARY", 0), mode)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    if sync_folder:
        fsync_dir(target.parent)
