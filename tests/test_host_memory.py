"""The host buffers disk reads land in (disk/host_memory.py): page-aligned always, huge
pages advised and populated where the OS offers them, freed with their last view.
[Note: where a direct read lands] says why; docs/benchmarks.md has the read rates."""

from __future__ import annotations

import gc
import os

import pytest
import torch

from offload_core.disk import host_memory
from offload_core.disk.host_memory import HUGE_PAGE, host_buffer, huge_pages_advisable
from offload_core.transfer.sync import SyncBackend

MiB = 1 << 20
needs_huge_pages = pytest.mark.skipif(
    not huge_pages_advisable(), reason="transparent huge pages are off (or not Linux) here"
)


def rss_anon() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping that holds ``address``."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and not line.startswith("VmFlags"):
                try:
                    start, end = (int(x, 16) for x in head.split("-"))
                except ValueError:
                    continue
                inside = start <= address < end
            elif inside and line.startswith("VmFlags:"):
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.parametrize("nbytes", [1, 4096, 12345, HUGE_PAGE - 1, HUGE_PAGE, 5 * MiB + 7])
def test_every_buffer_is_page_aligned_and_writable(nbytes: int) -> None:
    buf = host_buffer(nbytes)
    assert buf.dtype == torch.uint8 and buf.device.type == "cpu"
    assert buf.numel() == nbytes and buf.is_contiguous()
    assert buf.data_ptr() % 4096 == 0
    buf.fill_(7)
    assert int(buf[-1]) == 7 and int(buf.sum()) == 7 * nbytes


@needs_huge_pages
def test_a_large_buffer_is_advised_huge_pages_and_starts_on_one() -> None:
    buf = host_buffer(8 * MiB)
    assert buf.data_ptr() % HUGE_PAGE == 0
    assert "hg" in vm_flags(buf.data_ptr())  # MADV_HUGEPAGE took on the buffer's range
    small = host_buffer(HUGE_PAGE - 4096)
    assert "hg" not in vm_flags(small.data_ptr())  # below one huge page: torch memory


@needs_huge_pages
def test_a_large_buffer_is_populated_at_once_and_freed_with_its_last_view() -> None:
    gc.collect()
    before = rss_anon()
    buf = host_buffer(64 * MiB)
    made = rss_anon() - before
    # Populated when made (not in the middle of the first read); no more than the buffer.
    assert 60 * MiB <= made <= 68 * MiB, made
    view = buf[4096:8192]
    del buf
    gc.collect()
    assert rss_anon() - before >= 60 * MiB  # a view keeps the whole buffer
    del view
    gc.collect()
    assert rss_anon() - before <= 4 * MiB


def test_without_huge_pages_a_large_buffer_is_torch_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(host_memory, "huge_pages_advisable", lambda: False)
    buf = host_buffer(8 * MiB)
    assert buf.data_ptr() % 4096 == 0 and buf.numel() == 8 * MiB
    if os.path.exists("/proc/self/smaps"):
        assert "hg" not in vm_flags(buf.data_ptr())


@needs_huge_pages
def test_the_cpu_ring_that_disk_reads_land_in_is_a_host_buffer() -> None:
    ring = SyncBackend(torch.device("cpu")).empty_device(16 * MiB)
    assert "hg" in vm_flags(ring.data_ptr())
