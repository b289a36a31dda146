"""Counters the engine keeps, and the snapshot users read."""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Counters:
    """Mutated by the engine (main thread and reader threads), under ``lock``."""

    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    forwards: int = 0
    group_loads: int = 0
    bytes_h2d: int = 0  # host -> onload device copies
    bytes_disk: int = 0  # read from files (group files or the source checkpoint)
    h2d_s: float = 0.0  # time the copies took (device timing where the device tells)
    #: Wall time during which at least one read was in flight: reads of several groups
    #: overlap on their threads and count once, so bytes_disk / disk_s is the rate the disk
    #: delivered (a sum over threads would halve it with two groups in flight).
    disk_s: float = 0.0
    reads_in_flight: int = 0
    reading_since: float = 0.0
    stall_s: float = 0.0  # time compute could not proceed because a group was not there
    on_demand_loads: int = 0  # loads the prefetcher did not predict
    #: Peaks of RssAnon/RssFile/RssShmem, sampled at apply and at every forward's end.
    peak_rss: dict[str, int] = field(
        default_factory=lambda: {"rss_anon": 0, "rss_file": 0, "rss_shmem": 0}
    )

    def sample_rss(self) -> None:
        from .memory import process_memory

        now = process_memory().as_dict()
        with self.lock:
            for k, v in now.items():
                self.peak_rss[k] = max(self.peak_rss[k], v)

    def read_started(self) -> None:
        with self.lock:
            if self.reads_in_flight == 0:
                self.reading_since = time.perf_counter()
            self.reads_in_flight += 1

    def read_finished(self, nbytes: int) -> None:
        """After ``read_started``, whether the read succeeded (``nbytes``) or failed (0)."""
        with self.lock:
            self.reads_in_flight -= 1
            self.bytes_disk += nbytes
            if self.reads_in_flight == 0:
                self.disk_s += time.perf_counter() - self.reading_since

    def add(self, **kw: float) -> None:
        with self.lock:
            for k, v in kw.items():
                setattr(self, k, getattr(self, k) + v)


@dataclass(frozen=True)
class OffloadStats:
    name: str
    kind: str  # kinds.OffloadKind's value: "model", "text_encoder"
    device: str
    level: str
    tier: str
    groups: int
    resident_groups: int
    prefetch_depth: int
    forwards: int
    group_loads: int
    on_demand_loads: int
    bytes_per_tier: dict[str, int]  # where the weights live: device / pinned / ram / disk
    bytes_h2d: int
    bytes_disk: int
    h2d_gbps: float | None
    disk_gbps: float | None
    transfer_s: float
    stall_s: float
    overlap: float | None  # share of transfer time hidden behind compute
    peak_vram: int | None
    peak_rss: dict[str, int]  # at forward boundaries: rss_anon / rss_file / rss_shmem
    never_ran: list[str]
    disk_folder: str | None
    notes: list[str]
    #: The host's sentence for why its settings (the planner's; None: set by the user).
    why: str | None = None
    #: This layout's number in the process, never reused: what a host keys per-layout state
    #: by (a name comes back when a network is laid out again).
    layout_id: int = 0
    #: Where each group is now, one letter per group in the plan's order
    #: (runtime/group_states.py: r resident, d on the device, f in flight, w waiting); "" once
    #: removed.
    group_states: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
