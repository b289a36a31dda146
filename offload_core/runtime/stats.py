"""Counters the engine keeps, and the snapshot users read."""

from __future__ import annotations

import threading
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
    disk_s: float = 0.0  # time the reads took, summed over reader threads
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

    def add(self, **kw: float) -> None:
        with self.lock:
            for k, v in kw.items():
                setattr(self, k, getattr(self, k) + v)


@dataclass(frozen=True)
class OffloadStats:
    name: str
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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def gbps(nbytes: int, seconds: float) -> float | None:
    return nbytes / seconds / 1e9 if seconds > 0 and nbytes > 0 else None
