"""The one /proc/self/maps parser (offload_core/disk/maps.py), read by the disk tier (which file
a tensor views) and by Forge's file views (which weights are pages of the checkpoint)."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import pytest
import torch

from offload_core.disk.maps import file_mappings, mapped_file_at

LINES = """\
55d0c0a00000-55d0c0a21000 r--p 00000000 08:01 1234 /usr/bin/python3.11
55d0c2000000-55d0c2400000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0000100000 r--p 00000000 08:01 99 /models/unet.safetensors
7f0000200000-7f0000300000 r--p 00000000 08:01 77 /tmp/group 3.bin (deleted)
7f0000400000-7f0000500000 rw-p 00000000 00:00 0
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
"""


def test_parses_file_lines_only_sorted(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(LINES)
    got = file_mappings(maps)
    assert [m.path for m in got] == [
        "/usr/bin/python3.11",
        "/models/unet.safetensors",
        "/tmp/group 3.bin",  # a path with a space, and the kernel's mark taken off
    ]
    assert [m.deleted for m in got] == [False, False, True]
    assert got[1].lo == 0x7F0000000000 and got[1].hi == 0x7F0000100000


def test_address_lookup(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(LINES)
    assert mapped_file_at(0x7F0000000010, maps) == Path("/models/unet.safetensors")
    assert mapped_file_at(0x7F0000100000, maps) is None  # hi is one past the end
    assert mapped_file_at(0x7F0000200010, maps) is None  # deleted: no path names it
    assert mapped_file_at(0x55D0C2000010, maps) is None  # the heap is no file


def test_no_proc_means_no_mappings(tmp_path: Path) -> None:
    assert file_mappings(tmp_path / "absent") == []
    assert mapped_file_at(1, tmp_path / "absent") is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_finds_a_real_mapping(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(range(256)) * 64)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as m:
        t = torch.frombuffer(m, dtype=torch.uint8)
        assert mapped_file_at(t.data_ptr()) == path
        ranges = [(x.lo, x.hi) for x in file_mappings()]
        assert any(lo <= t.data_ptr() < hi for lo, hi in ranges)
        del t
