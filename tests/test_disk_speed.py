"""The disk folder's read speed measured, not assumed (offload_core/disk/speed_probe.py and
disk_speed.py): a bounded probe the first time a folder is planned, kept per device in the
folder's speed file, a prompt's measure winning over it, and a folder the probe cannot use
leaving the plan on the assumed figure with the reason said."""

from __future__ import annotations

import errno
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from offload_core.disk import speed_probe
from offload_core.planner import NetworkFacts, Wish, disk_speed, plan_graph
from offload_core.planner.facts import ASSUMED_DISK_GBPS
from offload_core.planner.machine import read_machine
from offload_core.units import GIB, MIB

from .planner_files import bytes_read


@pytest.fixture(autouse=True)
def small_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 16 MiB probe (the default is 256 MiB) and no device remembered from other tests."""
    monkeypatch.setattr(speed_probe, "MAX_BYTES", 16 * MIB)
    monkeypatch.setattr(disk_speed, "_by_device", {})


def on_disk(machine: Any) -> str:
    net = NetworkFacts("m", "model", 8 * GIB, (GIB // 2,) * 16, wish=Wish(tier="disk"))
    return plan_graph(machine, [net]).choices[0].reason


def test_the_probe_reads_at_most_its_bound_and_leaves_nothing(tmp_path: Path) -> None:
    with bytes_read() as n:
        found = speed_probe.probe(tmp_path / "new" / "folder", max_bytes=16 * MIB)
    assert found.gbps is not None and found.gbps > 0 and found.why is None
    assert 0 < found.bytes_read <= 16 * MIB
    assert n[0] <= 16 * MIB + 64 * 1024  # every read() of this process, the probe's included
    assert list(tmp_path.iterdir()) == []  # its file, marker, folder and the made folders gone
    timed_out = speed_probe.probe(tmp_path, max_bytes=16 * MIB, max_seconds=0.0)
    assert timed_out.gbps is None and "read nothing" in (timed_out.why or "")


def test_the_first_plan_probes_and_the_next_do_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with bytes_read() as first:
        m = read_machine(vram_free=None, disk_folder=str(tmp_path), probe=True)
    assert m.disk_probed and m.disk_measured and m.disk_gbps > 0
    assert MIB <= first[0] <= 16 * MIB + 64 * 1024
    assert " read (probed)" in on_disk(m)
    kept = json.loads((tmp_path / disk_speed.FILE).read_text())
    assert kept["device"] == os.stat(tmp_path).st_dev and kept["probe_gbps"] > 0
    monkeypatch.setattr(disk_speed, "_by_device", {})  # a new process: the file alone says it
    with bytes_read() as second:
        again = read_machine(vram_free=None, disk_folder=str(tmp_path), probe=True)
    assert second[0] < MIB and again.disk_probed and again.disk_gbps == round(m.disk_gbps, 3)
    # Another folder on the same device, in this process: its figure, no second probe.
    other = tmp_path / "other"
    other.mkdir()
    read_machine(vram_free=None, disk_folder=str(tmp_path), probe=True)  # remembered again
    with bytes_read() as third:
        assert read_machine(vram_free=None, disk_folder=str(other), probe=True).disk_probed
    assert third[0] < MIB


def test_a_prompts_measure_wins_over_the_probe(tmp_path: Path) -> None:
    assert disk_speed.for_plan(str(tmp_path)).source == "probe"
    assert disk_speed.record(str(tmp_path), 3.0)
    assert disk_speed.known(str(tmp_path)) == disk_speed.DiskSpeed(3.0, "prompt")
    m = read_machine(vram_free=None, disk_folder=str(tmp_path), probe=True)
    assert (m.disk_gbps, m.disk_measured, m.disk_probed) == (3.0, True, False)
    assert on_disk(m).endswith("hides a 3.0 GB/s read")  # measured: nothing to add
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    disk_speed.record(str(fresh), 2.5)
    with bytes_read() as n:
        assert disk_speed.for_plan(str(fresh)) == disk_speed.DiskSpeed(2.5, "prompt")
    assert n[0] < MIB  # a prompt's figure: no probe at all


def test_a_figure_kept_for_another_device_is_not_this_ones(tmp_path: Path) -> None:
    (tmp_path / disk_speed.FILE).write_text(json.dumps({"probe_gbps": 9.0, "device": -1}))
    assert disk_speed.known(str(tmp_path)) == disk_speed.ASSUMED
    (tmp_path / disk_speed.FILE).write_text(json.dumps({"read_gbps": 1.5}))  # before devices
    assert disk_speed.known(str(tmp_path)) == disk_speed.DiskSpeed(1.5, "prompt")


def _assumed_with(tmp_path: Path, words: str) -> None:
    m = read_machine(vram_free=None, disk_folder=str(tmp_path), probe=True)
    assert (m.disk_gbps, m.disk_measured, m.disk_probed) == (ASSUMED_DISK_GBPS, False, False)
    assert m.disk_why_assumed is not None and words in m.disk_why_assumed
    reason = on_disk(m)
    assert f"{ASSUMED_DISK_GBPS:.1f} GB/s read (assumed; " in reason and words in reason
    assert not (tmp_path / speed_probe.FOLDER).exists()
    assert not (tmp_path / disk_speed.FILE).exists()  # nothing kept: the next plan tries again


def test_a_full_disk_leaves_the_plan_on_the_assumed_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(speed_probe.os, "write", full)
    _assumed_with(tmp_path, os.strerror(errno.ENOSPC))


def test_a_disk_with_no_room_for_the_probe_is_not_probed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    usage = type("Usage", (), {"free": 70 * MIB, "total": GIB, "used": 0})()
    monkeypatch.setattr(speed_probe.shutil, "disk_usage", lambda p: usage)
    _assumed_with(tmp_path, "free beside the margin")


def test_a_read_only_folder_leaves_the_plan_on_the_assumed_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a read-only mount answers (this suite may run as root, whom permissions do not
    stop): EROFS on the probe's first write, its folder."""
    real = Path.mkdir

    def read_only(self: Path, *a: Any, **kw: Any) -> None:
        if self.name == speed_probe.FOLDER:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        real(self, *a, **kw)

    monkeypatch.setattr(Path, "mkdir", read_only)
    _assumed_with(tmp_path, os.strerror(errno.EROFS))


def test_a_plan_that_does_not_probe_says_assumed(tmp_path: Path) -> None:
    m = read_machine(vram_free=None, disk_folder=str(tmp_path))
    assert not m.disk_measured and m.disk_why_assumed is None
    assert not (tmp_path / disk_speed.FILE).exists()
    assert on_disk(m).endswith(f"{ASSUMED_DISK_GBPS:.1f} GB/s read (assumed)")
    # On a GPU the read is slower than compute, whose figure is assumed too, and said so.
    reason = on_disk(replace(m, vram_free=4 * GIB))
    assert f"{ASSUMED_DISK_GBPS:.1f} GB/s read (assumed) is slower than" in reason
    assert "(~20.0 GB/s, assumed)" in reason


def test_without_direct_io_the_cache_is_dropped_and_without_either_nothing_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No O_DIRECT (some platforms and filesystems): buffered reads after DONTNEED, the
    same bound. Neither (Windows): the reads would time the page cache, so no figure."""
    monkeypatch.delattr(os, "O_DIRECT", raising=False)
    with bytes_read() as n:
        buffered = speed_probe.probe(tmp_path, max_bytes=16 * MIB)
    assert buffered.gbps is not None and not buffered.direct
    assert 0 < buffered.bytes_read <= 16 * MIB and n[0] <= 16 * MIB + 64 * 1024
    monkeypatch.delattr(os, "posix_fadvise", raising=False)
    cached = speed_probe.probe(tmp_path, max_bytes=16 * MIB)
    assert cached.gbps is None and "page cache" in (cached.why or "")
    assert list(tmp_path.iterdir()) == []
