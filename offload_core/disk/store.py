"""The disk tier's files: a folder Ferry owns, one safetensors file per group.

Rules that keep a user's data safe:
- Ferry writes only inside ``<disk_path>/ferry-<name>/``, a folder it creates and marks with
  ``.ferry-owned``; it never deletes a file it did not write, and refuses a folder of that name
  that it did not create.
- A group file is written to ``*.tmp`` and renamed only once complete and fsynced, so a crash or
  a full disk never leaves a file that looks whole. The marker says "writing" until every group
  is on disk; a folder left "writing" by a dead process is stale and is rewritten.
- Every read is checked (disk/plan.py, [Note: what is checked when]).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ..errors import DiskPathError
from ..formats.safetensors import NAMES, aligned_header, byte_view
from ..model.layout import Entry
from .durable import atomic_write, fsync_dir
from .folder import check_room, make_folder, make_root
from .plan import ReadPlan, checksummed, open_plan

log = logging.getLogger("ferry")

MARKER = ".ferry-owned"
_GROUP_FILE = re.compile(r"^group-\d{5}\.safetensors(\.tmp)?$")

#: Folders of live stores in this process: two offloads never share one.
_IN_USE: set[str] = set()


def _pid_alive(pid: int) -> bool:
    # psutil, not os.kill(pid, 0): on Windows os.kill terminates the process it names.
    import psutil

    return pid > 0 and psutil.pid_exists(pid)


def _slug(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.")
    return s[:60] or "model"


class GroupStore:
    """The folder holding one offloaded model's group files."""

    def __init__(self, folder: Path, stale_note: str | None) -> None:
        self.direct_io = True
        self.created_parents: list[Path] = []
        self.folder = folder
        self.stale_note = stale_note
        self.written: list[Path] = []

    @classmethod
    def open(
        cls, disk_path: str, name: str, need_bytes: int, held: frozenset[str] = frozenset()
    ) -> GroupStore:
        """Checks and claims the folder before anything is written. ``held``: folders whose
        old files another program holds (skipped this time)."""
        root, created = make_root(disk_path)
        folder, stale_note = _choose_folder(root, f"ferry-{_slug(name)}", held)
        reclaim = _own_files_size(folder) if folder.exists() else 0
        check_room(root, need_bytes, reclaim)
        make_folder(root, folder)
        store = cls(folder, stale_note)
        store.created_parents = created
        if store._remove_own_files(tolerate=True):
            # Old files another program still holds (Windows refuses to delete them): this
            # folder cannot be rewritten now; the next free name is taken instead.
            return cls.open(disk_path, name, need_bytes, held | {str(folder.resolve())})
        store._write_marker("writing")
        _IN_USE.add(str(folder.resolve()))
        return store

    def _write_marker(self, state: str) -> None:
        mark = {"ferry": 1, "pid": os.getpid(), "state": state, "time": time.time()}
        with atomic_write(self.folder / MARKER, tmp=self.folder / (MARKER + ".tmp")) as f:
            f.write(json.dumps(mark).encode())

    def mark_ready(self) -> None:
        fsync_dir(self.folder)  # every group file's rename, before the marker says "ready"
        self._write_marker("ready")

    def reopen(self) -> None:
        """Makes the folder again if someone deleted it (repair.py rewrites a group in it)."""
        if not (self.folder / MARKER).exists():
            self.folder.mkdir(parents=True, exist_ok=True)
            self._write_marker("ready")

    def _remove_own_files(self, tolerate: bool = False) -> list[Path]:
        """Deletes Ferry's group files here; with ``tolerate``, returns those the OS refused
        (in use) instead of raising."""
        left = []
        for p in self.folder.iterdir():
            if _GROUP_FILE.match(p.name):
                if tolerate:
                    if not _unlink(p):
                        left.append(p)
                else:
                    p.unlink()
        return left

    def write_group(
        self,
        index: int,
        entries: list[Entry],
        slab: torch.Tensor,
        let_go: Callable[[], None] | None = None,
    ) -> ReadPlan:
        """Writes ``slab`` (the group's packed bytes, on the CPU) as a safetensors file.
        ``let_go`` runs once the new bytes are safe in ``*.tmp``, before the rename: it
        closes what this process holds of the file being replaced (Windows refuses to
        replace a file that is open or mapped)."""
        path = self.folder / f"group-{index:05d}.safetensors"
        tmp = path.with_name(path.name + ".tmp")
        data = byte_view(slab)
        chunks = checksummed([(0, 0, len(data))], data)  # file offsets from the data's start
        header = group_header(entries, len(data))
        try:
            # The folder is fsynced once for all groups, in mark_ready.
            with atomic_write(path, tmp=tmp, before_replace=let_go, sync_folder=False) as f:
                f.write(header)
                f.write(data)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                raise DiskPathError(
                    "disk_path",
                    f"the disk filled up while writing {path.name} in {self.folder} "
                    f"({e.strerror}); nothing was "
                    "lost: the model is as it was before the layout (in RAM, or still in its "
                    "checkpoint file); free space or choose another disk_path",
                ) from None
            raise
        self.written.append(path)
        at = len(header)
        chunks = [replace(c, file_offset=at + c.file_offset) for c in chunks]
        return open_plan(path, chunks, owned=True, direct=self.direct_io)

    def delete(self) -> None:
        """Deletes the files this store wrote, its marker, and the folder if then empty. A
        file another program holds open cannot be deleted on Windows: it is left with the
        marker (state "leftover"), said once, and the next layout in this folder rewrites it
        (``_choose_folder``); nothing raises, the model is already back."""
        _IN_USE.discard(str(self.folder.resolve()))
        left = [p for p in self.written if not _unlink(p)]
        self.written.clear()
        if not self.folder.exists():
            return
        left += self._remove_own_files(tolerate=True)
        if left:
            self._write_marker("leftover")
            log.warning(
                "ferry: could not delete %s in %s (open in another program); the next layout "
                "in this folder removes it",
                ", ".join(p.name for p in left[:3]) + (", ..." if len(left) > 3 else ""),
                self.folder,
            )
            return
        for n in (MARKER, MARKER + ".tmp"):
            (self.folder / n).unlink(missing_ok=True)
        for d in [self.folder, *self.created_parents]:
            try:
                d.rmdir()
            except OSError:
                break  # the user put something of theirs here: leave it


def _unlink(path: Path) -> bool:
    """Deletes ``path`` (gone already counts); False where the OS refuses because the file
    is in use (Windows: another handle or mapping holds it)."""
    try:
        path.unlink(missing_ok=True)
    except PermissionError:
        return False
    return True


def _choose_folder(
    root: Path, base: str, held: frozenset[str] = frozenset()
) -> tuple[Path, str | None]:
    """The first ``base[-n]`` folder that is free, or Ferry's own left by a dead run (then a
    note says it is rewritten). Someone else's folder is never touched."""
    for n in range(1, 1000):
        folder = root / (base if n == 1 else f"{base}-{n}")
        if str(folder.resolve()) in _IN_USE or str(folder.resolve()) in held:
            continue
        if not folder.exists():
            return folder, None
        marker = _read_marker(folder)
        if marker is None:
            continue  # someone else's folder: never touch it, pick another name
        pid = int(marker.get("pid", -1))
        if pid != os.getpid() and _pid_alive(pid) and marker.get("state") == "ready":
            continue  # a live process is using it
        return folder, (
            f"found files left by an earlier run in {folder} "
            f"(state {marker.get('state')!r}, pid {pid}); rewriting them"
        )
    raise DiskPathError("disk_path", f"too many ferry-* folders in {root}; clean it up")


def _own_files_size(folder: Path) -> int:
    if _read_marker(folder) is None:
        return 0
    return sum(p.stat().st_size for p in folder.iterdir() if _GROUP_FILE.match(p.name))


def _read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("ferry") == 1 else None


def group_header(entries: list[Entry], data_len: int) -> bytes:
    """A safetensors header whose tensors sit at the slab's offsets (64-byte aligned), the
    data section starting on a page boundary (formats.safetensors.aligned_header). The
    chunks' checksums stay in memory (the ReadPlan), not in the file: nothing reads a group
    file's header back."""
    table: dict[str, Any] = {"__metadata__": {"ferry": "1"}}
    for e in entries:
        names = e.inner_names or ("",)
        for part, inner in zip(e.parts, names):
            key = e.qualname + (f".{inner}" if inner else "")
            if part.contiguous and part.dtype in NAMES:
                info = {"dtype": NAMES[part.dtype], "shape": list(part.size)}
            else:
                info = {"dtype": "U8", "shape": [part.nbytes]}
            table[key] = {**info, "data_offsets": [part.offset, part.offset + part.nbytes]}
    return aligned_header(table, data_len)
