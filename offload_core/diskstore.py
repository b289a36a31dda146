"""The disk tier's files: a folder Ferry owns, one safetensors file per group.

Rules that keep a user's data safe:
- Ferry writes only inside ``<disk_path>/ferry-<name>/``, a folder it creates and marks with
  ``.ferry-owned``; it never deletes a file it did not write, and refuses a folder of that name
  that it did not create.
- A group file is written to ``*.tmp`` and renamed only once complete and fsynced, so a crash or
  a full disk never leaves a file that looks whole. The marker says "writing" until every group
  is on disk; a folder left "writing" by a dead process is stale and is rewritten.
- Every read is checked: the file's size and mtime against what was written, each 16 MiB chunk
  against its CRC32. A bad chunk raises CorruptGroupFileError; its bytes are never used.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import CorruptGroupFileError, DiskPathError
from .layout import PAGE, Entry

MARKER = ".ferry-owned"
CHUNK = 16 << 20
#: Free space kept beside the group files, so Ferry never fills a disk to the last byte.
SPACE_MARGIN = 64 << 20
_GROUP_FILE = re.compile(r"^group-\d{5}\.safetensors(\.tmp)?$")

_ST_DTYPES = {
    torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
    torch.int8: "I8", torch.uint8: "U8", torch.int16: "I16", torch.int32: "I32",
    torch.int64: "I64", torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}  # fmt: skip
_TORCH_DTYPES = {v: k for k, v in _ST_DTYPES.items()}


@dataclass(frozen=True)
class Chunk:
    """``nbytes`` at ``file_offset`` land at ``buf_offset`` of the group's slab."""

    file_offset: int
    buf_offset: int
    nbytes: int
    crc: int


@dataclass(frozen=True)
class FileIdentity:
    """What changes whenever anyone writes the file: ctime cannot be set back by ``utime``,
    so a write that restores size and mtime is caught too."""

    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        return cls(st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass
class ReadPlan:
    """How to bring one group's slab in from a file: its chunks and the file's identity.

    [Note: what is checked when]
    Every read checks the file's identity (inode, size, mtime, ctime: one ``fstat``). The
    chunks' CRC32s are checked on the first read of each group in the process (``verified``),
    and on any read after the identity changed (anyone wrote the file: ctime moves even when
    size and mtime are put back); if they match, the new identity is recorded, else the read
    fails. That catches what the identity cannot (a write the disk got wrong, a torn file from
    an earlier run) at 0.29 CPU-s per GB once, not on every forward. ``DiskTier(verify=
    "every_read")`` checks them on every read (media that can rot under an unchanged file).
    """

    path: Path
    fd: int
    identity: FileIdentity
    chunks: list[Chunk]
    owned: bool  # a Ferry group file (deleted on remove) or the user's checkpoint
    verified: bool = False  # the chunks' checksums matched once in this process
    verify_every_read: bool = False
    #: A second descriptor opened with O_DIRECT (-1: none). Page-aligned chunks are read
    #: through it straight into the (page-aligned) buffer: no page-cache copy, less CPU.
    direct_fd: int = -1

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.chunks)

    @property
    def size(self) -> int:
        return self.identity.size

    def needs_checksums(self, changed: FileIdentity | None) -> bool:
        """Whether this read checks the CRC32s; ``changed`` is what check_identity found."""
        return changed is not None or self.verify_every_read or not self.verified

    def accept(self, identity: FileIdentity | None) -> None:
        """After a read whose checksums matched (or were not due)."""
        self.verified = True
        if identity is not None:
            self.identity = identity

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.drop_direct()

    def drop_direct(self) -> None:
        fd, self.direct_fd = self.direct_fd, -1
        if fd >= 0:
            os.close(fd)


def _bytes_view(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU uint8 tensor, without a copy."""
    return memoryview(t.numpy()).cast("B")  # type: ignore[arg-type]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _slug(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.")
    return s[:60] or "model"


_IN_USE: set[str] = set()


class GroupStore:
    """The folder holding one offloaded model's group files."""

    def __init__(self, folder: Path, stale_note: str | None) -> None:
        self.direct_io = True
        self.created_parents: list[Path] = []
        self.folder = folder
        self.stale_note = stale_note
        self.written: list[Path] = []

    # -- choosing and checking the folder, before anything is written -------------------
    @classmethod
    def open(cls, disk_path: str, name: str, need_bytes: int) -> GroupStore:
        root = Path(disk_path).expanduser()
        if root.exists() and not root.is_dir():
            raise DiskPathError("disk_path", f"{root} is a file; give a folder for the disk tier")
        created = []  # the folders Ferry makes for disk_path: removed again if left empty
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
        base = f"ferry-{_slug(name)}"
        stale_note = None
        for n in range(1, 1000):
            folder = root / (base if n == 1 else f"{base}-{n}")
            key = str(folder.resolve())
            if key in _IN_USE:
                continue
            if not folder.exists():
                break
            marker = _read_marker(folder)
            if marker is None:
                continue  # someone else's folder: never touch it, pick another name
            pid = int(marker.get("pid", -1))
            if pid != os.getpid() and _pid_alive(pid) and marker.get("state") == "ready":
                continue  # a live process is using it
            stale_note = (
                f"found files left by an earlier run in {folder} "
                f"(state {marker.get('state')!r}, pid {pid}); rewriting them"
            )
            break
        else:
            raise DiskPathError("disk_path", f"too many ferry-* folders in {root}; clean it up")
        reclaim = _own_files_size(folder) if folder.exists() else 0
        free = shutil.disk_usage(root).free + reclaim
        if free < need_bytes + SPACE_MARGIN:
            raise DiskPathError(
                "disk_path",
                f"{root} has {free / 2**30:.2f} GB free but the offloaded groups need "
                f"{need_bytes / 2**30:.2f} GB (+{SPACE_MARGIN >> 20} MB margin); free space or "
                "choose a disk_path on a larger drive",
            )
        try:
            folder.mkdir(exist_ok=True)
            # Probe with a real write: permissions can lie (read-only mounts, ACLs).
            probe = folder / ".ferry-probe"
            probe.write_bytes(b"x")
            probe.unlink()
        except OSError as e:
            raise DiskPathError(
                "disk_path", f"cannot write in {root} ({e.strerror}); choose a writable folder"
            ) from None
        store = cls(folder, stale_note)
        store.created_parents = created
        store._remove_own_files()
        store._write_marker("writing")
        _IN_USE.add(str(folder.resolve()))
        return store

    def _write_marker(self, state: str) -> None:
        tmp = self.folder / (MARKER + ".tmp")
        tmp.write_text(
            json.dumps({"ferry": 1, "pid": os.getpid(), "state": state, "time": time.time()})
        )
        os.replace(tmp, self.folder / MARKER)

    def mark_ready(self) -> None:
        _fsync_dir(self.folder)
        self._write_marker("ready")

    def _remove_own_files(self) -> None:
        for p in self.folder.iterdir():
            if _GROUP_FILE.match(p.name):
                p.unlink()

    # -- writing one group ---------------------------------------------------------------
    def write_group(self, index: int, entries: list[Entry], slab: torch.Tensor) -> ReadPlan:
        """Writes ``slab`` (the group's packed bytes, on the CPU) as a safetensors file."""
        path = self.folder / f"group-{index:05d}.safetensors"
        tmp = path.with_name(path.name + ".tmp")
        data = _bytes_view(slab)
        crcs = [zlib.crc32(data[o : o + CHUNK]) for o in range(0, len(data), CHUNK)]
        header = _header(entries, len(data), index, crcs)
        try:
            with open(tmp, "wb") as f:
                f.write(header)
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as e:
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass
            if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                raise DiskPathError(
                    "disk_path",
                    f"the disk filled up while writing {path.name} ({e.strerror}); nothing was "
                    "lost and the model is resident again; free space or choose another disk_path",
                ) from None
            raise
        self.written.append(path)
        data_start = len(header)
        chunks = [
            Chunk(data_start + o, o, min(CHUNK, len(data) - o), c)
            for o, c in zip(range(0, len(data), CHUNK), crcs)
        ]
        return open_plan(path, chunks, owned=True, direct=self.direct_io)

    def delete(self) -> None:
        """Deletes the files this store wrote, its marker, and the folder if then empty."""
        _IN_USE.discard(str(self.folder.resolve()))
        for p in self.written:
            try:
                p.unlink()
            except FileNotFoundError:
                pass
        self.written.clear()
        if not self.folder.exists():
            return
        self._remove_own_files()
        for n in (MARKER, MARKER + ".tmp"):
            try:
                (self.folder / n).unlink()
            except FileNotFoundError:
                pass
        for d in [self.folder, *self.created_parents]:
            try:
                d.rmdir()
            except OSError:
                break  # the user put something of theirs here: leave it


def _own_files_size(folder: Path) -> int:
    if _read_marker(folder) is None:
        return 0
    return sum(p.stat().st_size for p in folder.iterdir() if _GROUP_FILE.match(p.name))


def _read_marker(folder: Path) -> dict | None:
    try:
        data = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("ferry") == 1 else None


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _header(entries: list[Entry], data_len: int, index: int, crcs: list[int]) -> bytes:
    """A safetensors header whose tensors sit at the slab's offsets (64-byte aligned).

    safetensors wants the data section fully covered, so alignment gaps become padding
    tensors; the header is padded with spaces so the data starts on a page boundary.
    """
    spans = []
    for e in entries:
        names = e.inner_names or ("",)
        for part, inner in zip(e.parts, names):
            key = e.qualname + (f".{inner}" if inner else "")
            if part.contiguous and part.dtype in _ST_DTYPES:
                info = {"dtype": _ST_DTYPES[part.dtype], "shape": list(part.size)}
            else:
                info = {"dtype": "U8", "shape": [part.nbytes]}
            spans.append((part.offset, part.offset + part.nbytes, key, info))
    spans.sort()
    table: dict[str, object] = {
        "__metadata__": {
            "ferry": "1",
            "group": str(index),
            "chunk": str(CHUNK),
            "crc32": ",".join(map(str, crcs)),
        }
    }
    pos = 0
    for start, end, key, info in spans:
        if start > pos:
            table[f"__ferry_pad_{pos}"] = {
                "dtype": "U8",
                "shape": [start - pos],
                "data_offsets": [pos, start],
            }
        table[key] = {**info, "data_offsets": [start, end]}
        pos = end
    if pos < data_len:
        table[f"__ferry_pad_{pos}"] = {
            "dtype": "U8",
            "shape": [data_len - pos],
            "data_offsets": [pos, data_len],
        }
    raw = json.dumps(table, separators=(",", ":")).encode()
    total = (8 + len(raw) + PAGE - 1) // PAGE * PAGE
    raw += b" " * (total - 8 - len(raw))
    return struct.pack("<Q", len(raw)) + raw


def open_plan(path: Path, chunks: list[Chunk], owned: bool, direct: bool = False) -> ReadPlan:
    fd = os.open(path, os.O_RDONLY)
    plan = ReadPlan(path, fd, FileIdentity.of(os.fstat(fd)), chunks, owned)
    if direct and hasattr(os, "O_DIRECT"):
        try:
            plan.direct_fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        except OSError:
            pass  # tmpfs and some network filesystems refuse O_DIRECT: buffered reads
    return plan


def _aligned(*values: int) -> bool:
    return all(v % PAGE == 0 for v in values)


def read_chunk(plan: ReadPlan, chunk: Chunk, buf: torch.Tensor, verify: bool = True) -> None:
    """Reads one chunk into ``buf`` at its offset and, with ``verify``, checks its CRC32.
    Runs on a worker thread (``os.preadv`` releases the GIL, so reads overlap compute)."""
    mv = _bytes_view(buf)[chunk.buf_offset : chunk.buf_offset + chunk.nbytes]
    got = 0
    direct = plan.direct_fd
    if direct >= 0 and not _aligned(
        chunk.file_offset, chunk.nbytes, buf.data_ptr() + chunk.buf_offset
    ):
        direct = -1
    while got < chunk.nbytes:
        if direct >= 0:
            try:
                n = os.preadv(direct, [mv[got:]], chunk.file_offset + got)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                direct = -1  # this filesystem or offset will not do direct I/O
                continue
            if n % PAGE:
                direct = -1  # a short read ends unaligned: finish buffered
        else:
            n = os.preadv(plan.fd, [mv[got:]], chunk.file_offset + got)
        if n == 0:
            raise CorruptGroupFileError(
                f"{plan.path} is truncated (ended {chunk.nbytes - got} bytes early); its "
                "contents were not used. Remove the offload and apply it again to rewrite it"
            )
        got += n
    if verify:
        check_chunk(plan, chunk, mv)


def check_chunk(plan: ReadPlan, chunk: Chunk, data: memoryview) -> None:
    """``data`` (the chunk's bytes, wherever they were read to) against its CRC32."""
    if zlib.crc32(data) != chunk.crc:
        raise CorruptGroupFileError(
            f"{plan.path} changed or is corrupted at byte {chunk.file_offset} (checksum "
            "mismatch); its contents were not used. Remove the offload and apply it again"
        )


def check_identity(plan: ReadPlan) -> FileIdentity | None:
    """None when the file is as recorded; its new identity when something wrote it since
    (the caller then checks this read's checksums and, if they match, records it). A
    changed size is refused here: the file was truncated or replaced."""
    now = FileIdentity.of(os.fstat(plan.fd))
    if now == plan.identity:
        return None
    if now.size != plan.size:
        what = "group file" if plan.owned else "source checkpoint"
        raise CorruptGroupFileError(
            f"the {what} {plan.path} was modified after the offload was applied (size "
            f"{plan.size} -> {now.size}); its contents were not used. Remove the offload and "
            "apply it again"
        )
    return now


# -- reading straight from the user's checkpoint ------------------------------------------


@dataclass(frozen=True)
class CheckpointTensor:
    dtype: torch.dtype | None
    shape: tuple[int, ...]
    start: int  # absolute file offset
    nbytes: int


def read_checkpoint_index(path: Path) -> dict[str, CheckpointTensor]:
    """Parses a safetensors header: tensor name -> where its bytes are in the file."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise DiskPathError("source_checkpoint", f"{path} is not a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > 100 << 20:
            raise DiskPathError(
                "source_checkpoint", f"{path} has an implausible header; not a safetensors file?"
            )
        try:
            table = json.loads(f.read(n))
        except ValueError:
            raise DiskPathError(
                "source_checkpoint", f"{path} has a corrupt safetensors header"
            ) from None
    base = 8 + n
    out = {}
    for key, info in table.items():
        if key == "__metadata__":
            continue
        s, e = info["data_offsets"]
        out[key] = CheckpointTensor(
            _TORCH_DTYPES.get(info["dtype"]), tuple(info["shape"]), base + s, e - s
        )
    return out


def checkpoint_chunks(
    entries: list[Entry], index: dict[str, CheckpointTensor], prefix: str
) -> list[tuple[int, int, int]] | None:
    """(file_offset, buf_offset, nbytes) per tensor if every tensor of the group is stored in
    the checkpoint exactly as the model holds it (same name, dtype, shape, contiguous);
    None otherwise. Bytes are compared afterwards by the caller."""
    out = []
    for e in entries:
        if e.subclass is not None:
            return None
        part = e.parts[0]
        t = index.get(prefix + e.qualname)
        if t is None or t.dtype != part.dtype or t.shape != part.size or not part.contiguous:
            return None
        if t.nbytes != part.nbytes:
            return None
        out.append((t.start, part.offset, part.nbytes))
    return out


def find_prefix(names: list[str], index: dict[str, CheckpointTensor]) -> str | None:
    """The key prefix under which the model's tensor names appear in the checkpoint
    (ComfyUI checkpoints use e.g. ``model.diffusion_model.``)."""
    if not names:
        return None
    probe = names[0]
    for key in index:
        if key.endswith(probe):
            prefix = key[: len(key) - len(probe)]
            if prefix == "" or prefix.endswith("."):
                return prefix
    return None
