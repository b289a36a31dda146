"""The shared RAM tier's segments: a group's bytes once per machine, in a file of a folder every
Ferry process of this user maps (``/dev/shm/ferry-shared-<uid>``, tmpfs: RAM, not disk).

[Note: one copy across processes]
A segment is named by a hash of what it holds (``segment_key``: the bytes themselves, their
count and this format's version), so two processes that laid out the same network (the same
file, the same LoRA, the same dtype) name the same segment and map the same pages, and two
whose bytes differ in one bit (another LoRA, a file changed on disk) never do: nothing is ever
served stale, whatever made the bytes. The price is one hash pass over a group when it is laid
out, which a process that finds the segment already made pays too (it has the bytes to hand:
its loader read them).

Who holds what: each process keeps one *holder file* (``holder-<pid>-<n>.keys``), locked
exclusively (flock) for as long as the process lives, listing the segments it maps. The kernel
drops an flock with its process, killed with -9 too, so a holder file anyone can lock is a dead
process's. Under the folder's own lock (an flock on the folder):
- a segment is written to ``<key>.partial`` and renamed to ``<key>.seg`` only when complete:
  a writer killed mid-fill leaves a partial name nobody maps (the next sweep deletes it);
- the last live holder that lets a segment go deletes it (a mapping keeps its pages until it
  is unmapped, so a process still computing from it is not disturbed);
- ``sweep`` (at each process's first use, and at every hold) deletes dead holders' files, the
  partials and every segment no live holder lists: what a crash left.
Files are 0600 in a 0700 folder that must be this user's own (a folder someone else made, or
a link, is refused). POSIX only: Windows has no flock (the tier is refused there by name).
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import itertools
import mmap
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ConfigError

SEGMENT = ".seg"
PARTIAL = ".partial"
HOLDER_PREFIX = "holder-"
HOLDER_SUFFIX = ".keys"
#: Bumped when the meaning of a segment's bytes changes: old segments are then never mapped.
FORMAT = b"ferry-shared-1"
_WRITE_CHUNK = 64 << 20


def default_root() -> Path:
    """The folder the tier uses: ``FERRY_SHARED_DIR`` where set (tests), else ``/dev/shm``'s
    (RAM), else the temp folder's (macOS has no /dev/shm: there the pages are a file's
    page cache)."""
    env = os.environ.get("FERRY_SHARED_DIR")
    if env:
        return Path(env)
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    uid = os.getuid() if hasattr(os, "getuid") else "user"  # Windows: refused at first use
    return base / f"ferry-shared-{uid}"


def segment_key(data: torch.Tensor) -> str:
    """What names a group's segment: a SHA-256 of its bytes ([Note: one copy across
    processes])."""
    h = hashlib.sha256(FORMAT)
    raw = data.contiguous().view(torch.uint8)
    h.update(raw.numel().to_bytes(8, "little"))
    h.update(raw.numpy().data)
    return h.hexdigest()[:48]


@dataclass
class Held:
    """One segment this process maps: its bytes (read-only) until ``release``."""

    key: str
    data: torch.Tensor
    mapping: mmap.mmap
    #: Whether this process made the segment (False: another process had, and it is mapped).
    made: bool
    #: Other live processes that listed the segment when it was taken.
    others: int


class SharedNamespace:
    """The tier's folder as one process sees it: holds and releases segments."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._guard = threading.Lock()  # this process's holder list
        self._keys: list[str] = []  # a key once per hold (two layouts may hold one)
        self._holder_fd: int | None = None
        self._holder_name = ""
        self.swept: list[str] = []  # what the first sweep deleted (a crash's leftovers)

    # -- the folder ---------------------------------------------------------------------------
    def _claim(self) -> None:
        if sys.platform == "win32":
            raise ConfigError(
                "tier", "the shared tier needs POSIX file locks (Linux, macOS); choose 'pinned'"
            )
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = self.root.lstat()
        except OSError as e:
            raise ConfigError("tier", f"the shared tier's folder {self.root}: {e}") from None
        import stat

        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise ConfigError(
                "tier",
                f"the shared tier's folder {self.root} must be a folder of this user's with "
                "mode 0700 (not a link); remove it or set FERRY_SHARED_DIR to another",
            )

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The folder's lock: every hold, release and sweep runs under it, one at a time
        across processes (an flock on the folder itself: no lock file is left behind)."""
        from .posix import lock, unlock

        with self._guard:
            if self._holder_fd is None:
                self._claim()
            fd = os.open(self.root, os.O_RDONLY)
            try:
                lock(fd, exclusive=True)
                try:
                    if self._holder_fd is None:
                        self._start()
                    yield
                finally:
                    unlock(fd)
            finally:
                os.close(fd)

    def _start(self) -> None:
        """This process's holder file, locked for its life; a first sweep."""
        from .posix import lock

        for n in itertools.count():
            name = f"{HOLDER_PREFIX}{os.getpid()}-{n}{HOLDER_SUFFIX}"
            try:
                fd = os.open(self.root / name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                break
            except FileExistsError:
                continue
        lock(fd, exclusive=True)
        self._holder_fd, self._holder_name = fd, name
        self.swept = self._sweep()
        atexit.register(self.release_all)

    # -- holders ------------------------------------------------------------------------------
    def _write_keys(self) -> None:
        assert self._holder_fd is not None
        data = "".join(k + "\n" for k in self._keys).encode()
        os.ftruncate(self._holder_fd, 0)
        os.lseek(self._holder_fd, 0, os.SEEK_SET)
        _write_all(self._holder_fd, memoryview(data))

    def _live_holders(self) -> dict[str, list[str]]:
        """Each other live process's holder file: the keys it lists. Dead ones are deleted."""
        from .posix import lock

        out: dict[str, list[str]] = {}
        for path in self.root.glob(f"{HOLDER_PREFIX}*{HOLDER_SUFFIX}"):
            if path.name == self._holder_name:
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                if lock(fd, exclusive=False, wait=False):  # nobody holds it: a dead process's
                    os.unlink(path)
                    continue
                out[path.name] = os.read(fd, os.fstat(fd).st_size).decode().split()
            finally:
                os.close(fd)
        return out

    def _sweep(self) -> list[str]:
        """Deletes what no live process holds: dead holders' files, partials, segments."""
        listed = set(self._keys)
        before = {p.name for p in self.root.iterdir()}
        for keys in self._live_holders().values():
            listed.update(keys)
        for path in self.root.iterdir():
            if path.suffix == PARTIAL or (path.suffix == SEGMENT and path.stem not in listed):
                path.unlink(missing_ok=True)
        return sorted(before - {p.name for p in self.root.iterdir()})

    def holders_of(self, key: str) -> int:
        """How many other live processes map segment ``key`` now."""
        with self._locked():
            return sum(key in keys for keys in self._live_holders().values())

    # -- segments -----------------------------------------------------------------------------
    def hold(self, data: torch.Tensor, key: str | None = None) -> Held:
        """``data``'s bytes as a segment this process maps read-only: the one another process
        made where it holds the same bytes, else a new one written from ``data``."""
        key = key or segment_key(data)
        nbytes = data.numel() * data.element_size()
        seg = self.root / f"{key}{SEGMENT}"
        with self._locked():
            others = self._live_holders()
            listed = {k for keys in others.values() for k in keys} | set(self._keys)
            made = not (seg.exists() and key in listed)
            if made:
                self._write_segment(seg, data, nbytes)
            self._keys.append(key)
            self._write_keys()
            n_others = sum(key in keys for keys in others.values())
        mapping, view = _map_read_only(seg, nbytes)
        return Held(key, view, mapping, made, n_others)

    def _write_segment(self, seg: Path, data: torch.Tensor, nbytes: int) -> None:
        partial = seg.with_suffix(PARTIAL)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            _write_all(fd, data.contiguous().view(torch.uint8).numpy().data)
        except OSError as e:
            os.close(fd)
            partial.unlink(missing_ok=True)
            if e.errno in (errno.ENOSPC, errno.ENOMEM):
                raise ConfigError(
                    "tier",
                    f"the shared tier's folder {self.root} is full ({nbytes} bytes more did "
                    "not fit); free RAM or choose tier 'pinned'",
                ) from None
            raise
        os.close(fd)
        os.rename(partial, seg)  # complete: only now can another process map it

    def release(self, held: Held) -> None:
        """This process lets ``held`` go; the last live holder deletes the segment. The
        caller has dropped every tensor viewing ``held.data`` (else the pages stay mapped
        until they go)."""
        with self._locked():
            if held.key in self._keys:
                self._keys.remove(held.key)
                self._write_keys()
            if held.key not in self._keys and not any(
                held.key in keys for keys in self._live_holders().values()
            ):
                (self.root / f"{held.key}{SEGMENT}").unlink(missing_ok=True)
        _unmap(held)

    def release_all(self) -> None:
        """At exit: every segment this process still lists, let go."""
        if self._holder_fd is None:
            return
        with self._locked():
            self._keys.clear()
            self._write_keys()
            self._sweep()
            os.unlink(self.root / self._holder_name)
            os.close(self._holder_fd)
            self._holder_fd = None


def _write_all(fd: int, data: memoryview) -> None:
    done = 0
    while done < len(data):
        done += os.write(fd, data[done : done + _WRITE_CHUNK])


def _map_read_only(path: Path, nbytes: int) -> tuple[mmap.mmap, torch.Tensor]:
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size != nbytes:
            raise ConfigError(
                "tier", f"shared segment {path.name} holds {size} bytes, not {nbytes}"
            )
        mapping = mmap.mmap(fd, max(nbytes, 1), flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    import warnings

    with warnings.catch_warnings():  # read-only on purpose: a write would fault, not corrupt
        warnings.simplefilter("ignore", UserWarning)
        view = (
            torch.frombuffer(mapping, dtype=torch.uint8, count=nbytes)
            if nbytes
            else (torch.empty(0, dtype=torch.uint8))
        )
    return mapping, view


def _unmap(held: Held) -> None:
    held.data = torch.empty(0, dtype=torch.uint8)
    try:
        held.mapping.close()
    except BufferError:  # a view of it is still alive: unmapped when the last one goes
        pass


_namespaces: dict[Path, SharedNamespace] = {}


def namespace(root: Path | None = None) -> SharedNamespace:
    """This process's view of the tier's folder (one per folder)."""
    root = root or default_root()
    if root not in _namespaces:
        _namespaces[root] = SharedNamespace(root)
    return _namespaces[root]
