"""Measuring the machine the benchmark runs on: raw disk read and pinned host-to-device
bandwidth (the ceilings every mode is compared against), page-cache dropping, and the
process's storage reads from /proc/self/io."""

from __future__ import annotations

import mmap
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from offload_core.units import GB

CHUNK = 16 << 20


def drop_page_cache(paths: list[Path]) -> None:
    """Evicts the cached pages of every file in ``paths`` (directories: every file under
    them), so the next read of them comes from the disk. Dirty pages cannot be dropped, so
    each file is fsynced first (a no-op for a file already on disk: call this once before
    timing, so a peer's unsynced writes are not flushed inside a timed forward)."""
    for p in paths:
        files = [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file()]
        for f in files:
            try:
                fd = os.open(f, os.O_RDONLY)
            except OSError:
                continue  # removed meanwhile
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _files(paths: list[Path]) -> list[Path]:
    out = []
    for p in paths:
        out += [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
    return out


def raw_read(paths: list[Path]) -> tuple[float, int]:
    """A raw cold sequential read of every file in ``paths`` (no offloader, no compute): the
    faster of one thread of 16 MiB buffered reads (what ``dd`` does) and one thread of
    64 MiB O_DIRECT reads, each from a cold cache, into one reused buffer. Returns (seconds,
    bytes): the ceiling the disk tier's reader is held against in the same run."""
    files = _files(paths)
    buf = mmap.mmap(-1, 64 << 20)  # page-aligned, as O_DIRECT needs; faulted in once
    buf.write(b"\0" * len(buf))
    mv = memoryview(buf)
    best, total = float("inf"), 0
    for direct, chunk in ((False, CHUNK), (True, 64 << 20)):
        drop_page_cache(files)
        total = 0
        t0 = time.perf_counter()
        for f in files:
            total += _read_file(f, mv[:chunk], direct)
        best = min(best, time.perf_counter() - t0)
    mv.release()
    buf.close()
    return best, total


def _read_file(path: Path, mv: memoryview, direct: bool) -> int:
    flags = os.O_RDONLY | (os.O_DIRECT if direct and hasattr(os, "O_DIRECT") else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        fd = os.open(path, os.O_RDONLY)  # a filesystem without O_DIRECT
    got = 0
    try:
        while True:
            try:
                n = os.preadv(fd, [mv], got)
            except OSError:  # an unaligned tail under O_DIRECT: finish buffered
                os.close(fd)
                fd = os.open(path, os.O_RDONLY)
                continue
            if n == 0:
                return got
            got += n
    finally:
        os.close(fd)


def storage_read_bytes() -> int:
    """Bytes this process (all its threads) caused to be read from the storage layer:
    page-cache hits do not count, page faults on mmapped files do."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


@dataclass(frozen=True)
class DiskProbe:
    nbytes: int
    one_thread_gbps: float  # readinto 16 MiB chunks into one reused buffer, cold cache
    four_threads_gbps: float  # 4 threads, preadv 16 MiB chunks into a reused buffer, cold
    dd_like_gbps: float  # 1 MiB sequential reads, cold (what `dd bs=1M` does)

    @property
    def raw_gbps(self) -> float:
        return max(self.one_thread_gbps, self.four_threads_gbps, self.dd_like_gbps)


def probe_disk(folder: Path, nbytes: int = 1 << 30) -> DiskProbe:
    """Cold sequential read bandwidth of the disk under ``folder``, without any offloader:
    the raw ceiling. Writes one scratch file, reads it three ways, deletes it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "disk-probe.bin"
    block = torch.randint(0, 256, (CHUNK,), dtype=torch.uint8).numpy().tobytes()
    with open(path, "wb") as f:
        for _ in range(nbytes // CHUNK):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    buf = bytearray(CHUNK)
    mv = memoryview(buf)
    try:
        # Each pattern reads the file from a cold cache; the best of two tries counts.
        def once(read: str) -> float:
            drop_page_cache([path])
            t0 = time.perf_counter()
            if read == "one":
                with open(path, "rb", buffering=0) as f:
                    while f.readinto(mv):
                        pass
            elif read == "dd":
                with open(path, "rb", buffering=0) as f:
                    small = mv[: 1 << 20]
                    while f.readinto(small):
                        pass
            else:
                fd = os.open(path, os.O_RDONLY)
                bufs = [memoryview(bytearray(CHUNK)) for _ in range(4)]

                def part(k: int) -> None:
                    for off in range(k * CHUNK, nbytes, 4 * CHUNK):
                        os.preadv(fd, [bufs[k]], off)

                try:
                    with ThreadPoolExecutor(4) as pool:
                        list(pool.map(part, range(4)))
                finally:
                    os.close(fd)
            return nbytes / (time.perf_counter() - t0) / GB

        rates = {k: max(once(k), once(k)) for k in ("one", "four", "dd")}
    finally:
        path.unlink()
    return DiskProbe(nbytes, rates["one"], rates["four"], rates["dd"])


def probe_pinned_h2d(nbytes: int = 1 << 30) -> float | None:
    """Pinned host-to-device copy bandwidth (GB/s) on the current CUDA device; None without
    one. The ceiling for every host-to-device copy an offloader makes."""
    if not torch.cuda.is_available():
        return None
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    for _ in range(2):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = 0.0
    for _ in range(5):
        start.record()
        dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        best = max(best, nbytes / (start.elapsed_time(end) / 1000) / GB)
    del src, dst
    torch.cuda.empty_cache()
    return best


class H2DCounter(TorchDispatchMode):
    """Counts bytes copied from the host to ``device`` by ops dispatched on this thread
    (peers copy on the calling thread; Ferry's copies are counted by Ferry itself)."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.nbytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default):
            src = args[1] if func is torch.ops.aten.copy_.default else args[0]
            dst = args[0] if func is torch.ops.aten.copy_.default else out
            if (
                isinstance(src, torch.Tensor)
                and isinstance(dst, torch.Tensor)
                and src.device.type == "cpu"
                and dst.device.type == self.device.type
            ):
                self.nbytes += dst.numel() * dst.element_size()
        return out
