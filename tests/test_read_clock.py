"""Counters.disk_s is the wall time during which any read was in flight (runtime/stats.py):
overlapping reads of two groups count once, so bytes_disk / disk_s is the disk's rate; a
read that fails still ends its interval."""

from __future__ import annotations

import pytest

from offload_core.runtime import stats
from offload_core.runtime.stats import Counters


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_overlapping_reads_count_once_and_gaps_not_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(stats.time, "perf_counter", clock)
    c = Counters()
    c.read_started()  # group A at t=100
    clock.now = 101.0
    c.read_started()  # group B at t=101, A still reading
    clock.now = 102.0
    c.read_finished(1000)  # A ends
    clock.now = 104.0
    c.read_finished(3000)  # B ends: 4 s of reading, not 2 + 3 = 5
    assert c.disk_s == pytest.approx(4.0) and c.bytes_disk == 4000
    clock.now = 110.0  # idle: not counted
    c.read_started()
    clock.now = 111.0
    c.read_finished(0)  # a failed read: its time counts, no bytes
    assert c.disk_s == pytest.approx(5.0) and c.bytes_disk == 4000
    assert c.reads_in_flight == 0
