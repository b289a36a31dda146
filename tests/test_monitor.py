"""The monitor: one sampler thread, started explicitly, a bounded ring, consistent snapshots,
and the stats of live offloads."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from offload_core import BlockLevel, OffloadKind, OffloadPolicy, RamTier, apply_offload
from offload_core.model.demo import build_demo_model, demo_inputs
from offload_core.tools.monitor import Monitor, OffloadSample, get_monitor


def _wait_for(cond, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_import_starts_no_thread() -> None:
    code = (
        "import threading, offload_core.tools.monitor as m, offload_core.tools.settings_file, offload_core.tools.autotune;"
        "m.get_monitor();"
        "print(sorted(t.name for t in threading.enumerate()), m.get_monitor().running)"
    )
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=repo
    ).stdout
    assert out.strip() == "['MainThread'] False"


def test_samples_into_a_bounded_ring_and_stops() -> None:
    mon = Monitor(interval_s=0.02, history_s=0.1, read_offloads=lambda: [])
    assert mon.capacity == 5 and not mon.running
    mon.start()
    mon.start()  # a second start is a no-op, not a second thread
    try:
        assert sum(t.name == "ferry-monitor" for t in threading.enumerate()) == 1
        _wait_for(lambda: len(mon.snapshot().samples) == 5)
        time.sleep(0.1)
        snap = mon.snapshot()
        assert len(snap.samples) == 5  # bounded: the oldest fell out
        ts = [s.t for s in snap.samples]
        assert ts == sorted(ts) and ts[-1] - ts[0] < 1.0
        s = snap.samples[-1]
        assert s.rss_anon > 0 and s.system_available > 0
        assert (s.vram_allocated is None) == (mon.device is None)
    finally:
        mon.stop()
    assert not mon.running
    assert not any(t.name == "ferry-monitor" for t in threading.enumerate())
    n = len(mon.snapshot().samples)
    time.sleep(0.08)
    assert len(mon.snapshot().samples) == n


def test_snapshot_is_a_copy_and_last_s_filters() -> None:
    mon = Monitor(interval_s=0.01, history_s=10, read_offloads=lambda: [])
    for _ in range(3):
        mon.sample_now()
    snap = mon.snapshot()
    mon.sample_now()
    assert len(snap.samples) == 3 and len(mon.snapshot().samples) == 4
    assert len(mon.snapshot(last_s=0.0).samples) == 1


def test_listener_errors_do_not_stop_sampling() -> None:
    seen: list[float] = []
    mon = Monitor(
        interval_s=0.02, history_s=1, read_offloads=lambda: [OffloadSample("m", {"forwards": 1})]
    )

    def bad(sample, offloads):  # type: ignore[no-untyped-def]
        raise RuntimeError("a closed websocket")

    mon.add_listener(bad)
    mon.add_listener(lambda s, o: seen.append(s.t) if o[0].name == "m" else None)
    mon.start()
    try:
        _wait_for(lambda: len(seen) >= 3)
    finally:
        mon.stop()
    assert mon.snapshot().offloads == [OffloadSample("m", {"forwards": 1})]


def test_a_failing_listener_is_logged_with_its_traceback_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    mon = Monitor(interval_s=1, history_s=10, read_offloads=lambda: [])

    def bad(sample, offloads):  # type: ignore[no-untyped-def]
        raise RuntimeError("a closed websocket")

    mon.add_listener(bad)
    with caplog.at_level(logging.DEBUG, logger="ferry"):
        for _ in range(3):
            mon.sample_now()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "listener" in warnings[0].getMessage()
    assert warnings[0].exc_info is not None and "a closed websocket" in caplog.text
    assert sum("failed again" in r.getMessage() for r in caplog.records) == 2
    assert len(mon.snapshot().samples) == 3, "sampling went on"


def test_a_handle_whose_stats_fail_is_reported_and_logged_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import offload_core.registry as registry
    from offload_core.tools import monitor

    class Broken:
        name = "broken-model"
        kind = OffloadKind.TEXT_ENCODER

        def stats(self) -> object:
            raise OSError("device gone")

    monkeypatch.setattr(registry, "live_offloads", lambda: [Broken()])
    monkeypatch.setattr(monitor, "_logged_stat_errors", set())
    with caplog.at_level(logging.WARNING, logger="ferry"):
        first, second = monitor.read_offloads(), monitor.read_offloads()
    err = {"error": "OSError: device gone"}
    assert first == second == [OffloadSample("broken-model", err, OffloadKind.TEXT_ENCODER)]
    assert [r.exc_info is not None for r in caplog.records] == [True]


def test_reports_live_offloads_with_their_stats() -> None:
    model = build_demo_model(size_gb=0.002, dtype=torch.float32)
    x = demo_inputs(model, tokens=8)
    handle = apply_offload(model, OffloadPolicy(level=BlockLevel(2), tier=RamTier()), onload_device="cpu",
                           name="monitor-test")  # fmt: skip
    try:
        with torch.inference_mode():
            model(**x)
        mon = Monitor(interval_s=1.0, history_s=10)
        mon.sample_now()
        mine = [o for o in mon.snapshot().offloads if o.name == handle.name]
        assert len(mine) == 1
        assert mine[0].stats["forwards"] == 1 and mine[0].stats["tier"] == "ram"
        assert mine[0].stats["bytes_per_tier"]["ram"] > 0
    finally:
        handle.remove()
    mon.sample_now()
    assert not [o for o in mon.snapshot().offloads if o.name == handle.name]


def test_shared_monitor_is_one_object_and_not_started() -> None:
    assert get_monitor() is get_monitor()
