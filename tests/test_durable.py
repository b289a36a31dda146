"""disk/durable.py: the one atomic write and the one folder fsync (group files, the quantized
cache, the settings file)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from offload_core.disk.durable import atomic_write, fsync_dir


def test_a_failed_write_keeps_the_old_file_and_removes_only_its_temp(tmp_path: Path) -> None:
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")
    (tmp_path / "keep.txt").write_text("not Ferry's")
    with pytest.raises(RuntimeError), atomic_write(target) as f:
        f.write(b"half")
        raise RuntimeError("died mid-write")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin", "keep.txt"]
    with atomic_write(target, tmp=tmp_path / "f.bin.tmp") as f:
        f.write(b"new")
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin", "keep.txt"]


def test_before_replace_runs_after_the_bytes_are_safe(tmp_path: Path) -> None:
    target, tmp = tmp_path / "g", tmp_path / "g.tmp"
    seen = []
    with atomic_write(target, tmp=tmp, before_replace=lambda: seen.append(tmp.read_bytes())) as f:
        f.write(b"bytes")
    assert seen == [b"bytes"] and target.read_bytes() == b"bytes" and not tmp.exists()


def test_fsync_dir_passes_over_only_windows_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsync_dir(tmp_path)
    with pytest.raises(FileNotFoundError):
        fsync_dir(tmp_path / "gone")  # the stricter of the two old copies: not swallowed

    def refuse(path: object, flags: int, mode: int = 0o777) -> int:
        raise PermissionError(errno.EACCES, "Windows opens no folder as a file")

    monkeypatch.setattr(os, "open", refuse)
    fsync_dir(tmp_path)


@pytest.mark.skipif(
    os.name == "nt" or os.environ.get("FERRY_PLATFORM_STANDIN") == "windows",
    reason="Windows opens no folder, so no folder fsync is tried",
)
def test_fsync_dir_raises_a_failed_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError, match="I/O error"):
        fsync_dir(tmp_path)
