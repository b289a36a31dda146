"""One background sampler of VRAM and RAM into a ring buffer that UIs only read.

Why a thread of our own: a web page polls once a second per open tab, and a tab that is
closed must not leave a hole in the history. So one thread samples about once a second into
a bounded ring buffer (the last few minutes), and every reader (the Gradio panel's timer,
the ComfyUI nodes' pushed stats) takes a consistent copy with ``snapshot()``.

Nothing starts at import: ``get_monitor().start()`` starts the thread; ``stop()`` ends it.

    mon = get_monitor(device="cuda").start()
    snap = mon.snapshot()        # samples oldest→newest + per-offload stats of the last tick
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ..offload_kind import LISTING_ORDER, OffloadKind
from ..runtime.memory import device_memory, process_memory, system_available_ram

log = logging.getLogger("ferry")


@dataclass(frozen=True)
class Sample:
    """One tick. Device fields are None where there is no accelerator or it does not tell."""

    t: float  # time.time() of the sample
    vram_allocated: int | None
    vram_reserved: int | None
    vram_device_used: int | None  # by all processes (driver's view)
    vram_total: int | None
    rss_anon: int
    rss_file: int
    rss_shmem: int
    system_available: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class OffloadSample:
    """The stats of one live offloaded model at the last tick (``OffloadStats.as_dict``), and
    what it is (kept apart from the stats: a handle whose stats fail still has a kind)."""

    name: str
    stats: dict[str, Any]
    kind: OffloadKind = OffloadKind.MODEL

    @property
    def title(self) -> str:
        """The line's title, the same in every UI: ``text encoder: t5xxl``."""
        return self.kind.line_title(self.name)


@dataclass(frozen=True)
class Snapshot:
    samples: list[Sample]
    offloads: list[OffloadSample] = field(default_factory=list)
    device: str | None = None
    running: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "running": self.running,
            "samples": [s.as_dict() for s in self.samples],
            "offloads": [
                {"name": o.name, "kind": o.kind.value, "stats": o.stats} for o in self.offloads
            ],
        }


def default_device() -> str | None:
    """The accelerator to watch, found without initialising CUDA (is_available uses NVML)."""
    acc = getattr(torch, "accelerator", None)
    if acc is not None:
        try:
            dev = acc.current_accelerator(check_available=True)
        except TypeError:  # older signature without check_available
            dev = acc.current_accelerator()
        except RuntimeError:
            dev = None
        if dev is not None:
            return str(dev.type)
    return "cuda" if torch.cuda.is_available() else None


#: (offload name, error type) pairs whose traceback is already in the log: a handle whose
#: stats fail keeps failing every tick, and one traceback says all there is to say.
_logged_stat_errors: set[tuple[str, str]] = set()


def read_offloads() -> list[OffloadSample]:
    """Every live offload's stats, read now: the diffusion models' first, then the text
    encoders' (offload_kind.LISTING_ORDER), each oldest first. One broken handle gives an ``error``
    entry (and one logged traceback) instead of stopping the sampler or a stats reply."""
    # Imported here: the registry belongs to the engine, and the monitor must stay usable
    # (RAM/VRAM only) in a tree where the engine is not importable.
    try:
        from ..registry import live_offloads
    except ImportError:
        log.debug("ferry monitor: no engine registry; sampling RAM/VRAM only", exc_info=True)
        return []
    out = []
    handles = sorted(live_offloads(), key=lambda h: LISTING_ORDER[h.kind])  # a stable sort
    for i, handle in enumerate(handles):
        name = str(getattr(handle, "name", None) or f"model {i}")
        try:
            stats = handle.stats().as_dict()
        except Exception as e:
            stats = {"error": f"{type(e).__name__}: {e}"}
            key = (name, type(e).__name__)
            if key not in _logged_stat_errors:
                _logged_stat_errors.add(key)
                log.warning("ferry monitor: reading %s's stats failed", name, exc_info=True)
        out.append(OffloadSample(name, stats, handle.kind))
    return out


Listener = Callable[[Sample, list[OffloadSample]], None]


def read_sample(device: str | None) -> Sample:
    """RAM and VRAM read now (one /proc read, one driver query)."""
    dev = device_memory(device) if device else None
    mem = process_memory()
    return Sample(
        t=time.time(),
        vram_allocated=dev.allocated if dev else None,
        vram_reserved=dev.reserved if dev else None,
        vram_device_used=dev.device_used if dev else None,
        vram_total=dev.device_total if dev else None,
        rss_anon=mem.rss_anon,
        rss_file=mem.rss_file,
        rss_shmem=mem.rss_shmem,
        system_available=system_available_ram(),
    )


class Monitor:
    """Samples every ``interval_s`` into a ring of ``history_s / interval_s`` samples."""

    def __init__(
        self,
        interval_s: float = 1.0,
        history_s: float = 300.0,
        device: str | None = None,
        *,
        read_offloads: Callable[[], list[OffloadSample]] = read_offloads,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        if not history_s >= interval_s:
            raise ValueError(f"history_s must be >= interval_s, got {history_s!r}")
        self.interval_s = float(interval_s)
        self.device = device if device is not None else default_device()
        self._ring: deque[Sample] = deque(maxlen=max(1, round(history_s / interval_s)))
        self._offloads: list[OffloadSample] = []
        self._read_offloads = read_offloads
        self._listeners: list[Listener] = []
        #: Listeners whose failure is already logged (a list: a bound method is not hashable
        #: by identity, so membership goes by equality).
        self._failed_listeners: list[Listener] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def capacity(self) -> int:
        return self._ring.maxlen or 0

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def sample_now(self) -> Sample:
        """Takes one sample, stores it, tells the listeners (the thread calls this)."""
        sample = read_sample(self.device)
        offloads = self._read_offloads()
        with self._lock:
            self._ring.append(sample)
            self._offloads = offloads
            listeners = list(self._listeners)
        for fn in listeners:
            self._tell(fn, sample, offloads)
        return sample

    def _tell(self, fn: Listener, sample: Sample, offloads: list[OffloadSample]) -> None:
        try:
            fn(sample, offloads)
        except Exception:
            # A listener's bug (e.g. a closed websocket) must not kill sampling. Its traceback
            # is logged on its first failure only: a broken listener fails every tick.
            with self._lock:
                first = fn not in self._failed_listeners
                if first:
                    self._failed_listeners.append(fn)
            if first:
                log.warning(
                    "ferry monitor: listener %r failed; sampling goes on", fn, exc_info=True
                )
            else:
                log.debug("ferry monitor: listener %r failed again", fn)

    def _run(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            self.sample_now()
            # Fixed-rate schedule, so a slow sample does not stretch the time axis.
            next_t += self.interval_s
            delay = next_t - time.monotonic()
            if delay < 0:
                next_t = time.monotonic()
                delay = 0
            if self._stop.wait(delay):
                break

    def start(self) -> Monitor:
        """Starts the sampler thread; a second call while running does nothing."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return self
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="ferry-monitor", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5 * self.interval_s + 1)
        self._thread = None

    def snapshot(self, last_s: float | None = None) -> Snapshot:
        """A copy of the ring (optionally only the last ``last_s`` seconds): safe to keep."""
        with self._lock:
            samples = list(self._ring)
            offloads = list(self._offloads)
        if last_s is not None and samples:
            cutoff = samples[-1].t - last_s
            samples = [s for s in samples if s.t >= cutoff]
        return Snapshot(samples, offloads, self.device, self.running)

    def add_listener(self, fn: Listener) -> None:
        """``fn(sample, offloads)`` runs on the sampler thread after each tick (keep it short)."""
        with self._lock:
            self._listeners.append(fn)


_shared: Monitor | None = None
_shared_lock = threading.Lock()


def get_monitor(interval_s: float = 1.0, history_s: float = 300.0) -> Monitor:
    """The process's one shared monitor (created on first call, NOT started)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Monitor(interval_s, history_s)
        return _shared
