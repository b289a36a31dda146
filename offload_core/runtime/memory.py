"""Reading process and device memory, split the way a user needs to read it.

File-backed pages (mmapped checkpoints, the page cache of group files) count in RSS; a
page-cache-heavy run would look like a leak if RSS were reported as one number. So RAM is
reported as RssAnon / RssFile / RssShmem from /proc/self/status.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

from .cgroup_memory import cgroup_available

if TYPE_CHECKING:
    from ..model.layout import Entry


@dataclass(frozen=True)
class ProcessMemory:
    rss_anon: int
    rss_file: int
    rss_shmem: int

    @property
    def rss(self) -> int:
        return self.rss_anon + self.rss_file + self.rss_shmem

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def process_memory() -> ProcessMemory:
    """This process's resident memory, from /proc/self/status (psutil elsewhere)."""
    try:
        fields: dict[str, int] = {}
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith((b"RssAnon:", b"RssFile:", b"RssShmem:")):
                    key, value = line.split(b":", 1)
                    fields[key.decode()] = int(value.split()[0]) * 1024
        return ProcessMemory(fields["RssAnon"], fields["RssFile"], fields["RssShmem"])
    except (OSError, KeyError):
        import psutil

        info = psutil.Process().memory_info()
        shared = int(getattr(info, "shared", 0))
        return ProcessMemory(int(info.rss) - shared, shared, 0)


def system_available_ram() -> int:
    """What the system could give this process now: psutil's "available", or less where
    the process's memory cgroup (a container) has less left (runtime/cgroup_memory.py)."""
    import psutil

    host = int(psutil.virtual_memory().available)
    limited = cgroup_available()
    return host if limited is None else min(host, limited)


@dataclass(frozen=True)
class DeviceMemory:
    allocated: int
    reserved: int
    peak_allocated: int
    device_used: int | None  # by all processes, where the driver tells
    device_total: int | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def device_memory(device: torch.device | str | None = None) -> DeviceMemory | None:
    """Memory of an accelerator, or None for the CPU. Never initialises CUDA itself."""
    dev = torch.device(device) if device is not None else None
    if dev is None or dev.type == "cpu":
        return None
    if dev.type == "cuda" and torch.cuda.is_initialized():
        used = total = None
        try:
            free, total = torch.cuda.mem_get_info(dev)
            used = total - free
        except RuntimeError:
            pass
        return DeviceMemory(
            torch.cuda.memory_allocated(dev),
            torch.cuda.memory_reserved(dev),
            torch.cuda.max_memory_allocated(dev),
            used,
            total,
        )
    acc = getattr(torch, "accelerator", None)
    if acc is not None and hasattr(acc, "memory_allocated"):
        try:
            return DeviceMemory(
                int(acc.memory_allocated(dev)),
                int(acc.memory_reserved(dev)),
                int(acc.max_memory_allocated(dev)),
                None,
                None,
            )
        except (RuntimeError, ValueError):
            return None
    return None


class PeakRssSampler:
    """Samples RssAnon/RssFile/RssShmem on a thread and keeps each one's peak.

    The kernel's VmHWM gives only the total's peak; the split needs sampling. Started by
    the caller (never at import), stopped with ``stop()`` or by leaving the ``with``.
    """

    def __init__(self, interval_s: float = 0.01) -> None:
        self.interval_s = interval_s
        first = process_memory()
        self._peak = {k: v for k, v in first.as_dict().items()}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        m = process_memory().as_dict()
        for k, v in m.items():
            if v > self._peak[k]:
                self._peak[k] = v

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def start(self) -> PeakRssSampler:
        self._thread = threading.Thread(target=self._run, name="ferry-rss-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> ProcessMemory:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        return self.peak

    @property
    def peak(self) -> ProcessMemory:
        return ProcessMemory(
            self._peak["rss_anon"], self._peak["rss_file"], self._peak["rss_shmem"]
        )

    def __enter__(self) -> PeakRssSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        fn = libc.malloc_trim
    except (OSError, AttributeError):  # musl and others have no malloc_trim
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


def trim_heap() -> None:
    """Hands whole free pages of the C heap back to the OS.

    glibc keeps freed blocks below its mmap threshold (which rises to 32 MB as large blocks are
    freed) in the heap: weights released group by group, or layer by layer while quantizing,
    would still count in RssAnon. ``malloc_trim(0)`` changes no allocator setting.
    """
    fn = _malloc_trim()
    if fn is not None:
        fn(0)


#: ``HeapTrimmer``'s step: a trim costs about 0.2 ms, so at most one per 16 MiB moved is
#: noise beside the copy.
TRIM_EVERY = 16 << 20


class HeapTrimmer:
    """Trims the C heap each time ``TRIM_EVERY`` bytes were let go, while a model's tensors are
    freed group by group (a layout, a restore): freed blocks below glibc's mmap threshold
    (it rises to 32 MB: most weights) stay in the heap, where the next groups' slabs, mapped
    anew, do not reuse them, so without a trim a re-layout held the network twice."""

    def __init__(self) -> None:
        self.let_go = 0

    def freed(self, nbytes: int) -> None:
        self.let_go += nbytes
        if self.let_go >= TRIM_EVERY:
            trim_heap()
            self.let_go = 0


def computes_from_copies(entries: Iterable[Entry]) -> bool:
    """Whether a group's forward computes from per-call copies of its weights: a tensor
    subclass (ComfyUI's ``QuantizedTensor``, torchao's) or one-byte storage (fp8, int8, GGUF's
    raw blocks) is dequantized into a new tensor each call; a plain float weight is used as
    it is.

    [Note: the heap trim on the forward path]
    The engine trims the C heap (``HeapTrimmer``) as such groups finish, on a host that
    computes (a CPU): freed, their copies stay in the heap once a large free has raised
    glibc's mmap threshold (+0.55 GB RssAnon for a 0.56 GB fp8 expert without the trim), and
    a trim hands them back, so RAM holds about one group's. A plain group's forward makes no
    such copies: its temporaries (activations) are a working set the next group takes again
    at once, and a trim there only hands pages to the kernel to fault back in (Flux on a CPU:
    1.07-1.11x resident with a trim per group, 0.96-1.01x without). Layouts and restores trim
    on their own (sources/lay_out.py, sources/give_back.py), where memory is let go for good.
    On a device a forward's temporaries are device memory: no trim.
    """
    return any(
        e.subclass is not None or any(p.dtype.itemsize == 1 for p in e.parts) for e in entries
    )


def release_freed_memory() -> None:
    """Collects garbage (tensors kept alive by reference cycles), then trims the heap."""
    gc.collect()
    trim_heap()
