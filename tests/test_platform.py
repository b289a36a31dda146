"""What differs by platform, tested on this Linux machine: the portable read backend
(Windows' way, no ``os.preadv``) and how it is chosen; an error from the platform or from
Ferry itself never taken for damage (the model is never dropped for a missing call); and
Windows' path forms (drive letters, shares, long paths) read with ``ntpath``.

The whole offload_core and nodes I/O suite also runs under tests/platform_standin.py's
Windows and macOS stand-ins (.ci/run); what a stand-in cannot show is said there."""

from __future__ import annotations

import ntpath
import os
import threading
from pathlib import Path

import pytest
import torch

from offload_core import (
    BlockLevel,
    ConfigError,
    DiskTier,
    LeafLevel,
    OffloadPolicy,
    RestoreIncompleteError,
    WeightsLostError,
    apply_offload,
    find_offload,
)
from offload_core.disk import files as files_module
from offload_core.disk.files import platform_backend, using
from offload_core.disk.folder import long_path
from offload_core.disk.portable import PortableFiles
from offload_core.disk.store import _pid_alive
from offload_core.policy import parse_disk_path
from tests.helpers import flip_byte, make_model, reference


def test_a_python_without_preadv_gets_the_portable_backend(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.delattr(os, "preadv", raising=False)
    backend = platform_backend()
    assert isinstance(backend, PortableFiles)
    assert "no os.preadv" in backend.name
    assert not backend.has_direct and not backend.maps_groups and not backend.huge_pages


def test_portable_reads_are_positioned_binary_and_safe_across_threads(tmp_path: Path) -> None:
    data = bytes(range(256)) * 4096 + b"\r\n\x1a\r\n"  # 1 MiB + CR LF and ^Z: text mode breaks them
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    backend = PortableFiles()
    fd = backend.open(path)
    errors: list[str] = []

    def reader(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        for _ in range(300):
            at = int(torch.randint(0, len(data), (1,), generator=g))
            n = int(torch.randint(1, 9000, (1,), generator=g))
            buf = bytearray(n)
            got = backend.pread(fd, memoryview(buf), at)
            if bytes(buf[:got]) != data[at : at + n]:
                errors.append(f"thread {seed}: {n} bytes at {at} differ")

    try:
        threads = [threading.Thread(target=reader, args=(s,)) for s in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        tail = bytearray(16)
        assert backend.pread(fd, memoryview(tail), len(data) - 5) == 5
        assert bytes(tail[:5]) == b"\r\n\x1a\r\n"
        assert backend.pread(fd, memoryview(tail), len(data)) == 0  # the end: 0, no error
    finally:
        os.close(fd)
    assert not errors, errors[:3]


class MissingCall(PortableFiles):
    """A platform without the call Ferry reads with, until ``fixed``: what Windows' Python
    did to main's disk tier (``os.preadv``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fixed = False

    def pread(self, fd: int, into: memoryview, offset: int) -> int:
        if not self.fixed:
            raise AttributeError("module 'os' has no attribute 'preadv'")
        return super().pread(fd, into, offset)


@pytest.mark.parametrize("level", [BlockLevel(1), LeafLevel()], ids=["block", "leaf"])
def test_a_missing_platform_call_is_never_damage(tmp_path, level):  # type: ignore[no-untyped-def]
    """The forward fails with what happened, the layout and the files stay, remove() keeps
    every group it could not read (RestoreIncompleteError, the offload still live), and once
    the call is there the same offload computes the resident output and removes cleanly."""
    x, ref = reference("bf16")
    model = make_model("bf16")
    backend = MissingCall()
    tier = DiskTier(str(tmp_path / "ferry"), cpu_read="copy")
    with using(backend):
        handle = apply_offload(model, OffloadPolicy(level=level, tier=tier), onload_device="cpu")
        folder = handle._placement.store.folder  # type: ignore[union-attr]
        files_before = sorted(p.name for p in folder.iterdir())
        with torch.no_grad(), pytest.raises(AttributeError, match="preadv"):
            model(**x)
        assert sorted(p.name for p in folder.iterdir()) == files_before
        assert not any("damaged" in n for n in handle.stats().notes)
        with pytest.raises(RestoreIncompleteError, match="Nothing was lost") as caught:
            handle.remove()
        assert caught.value.groups, "some groups were kept"
        assert not handle.removed and find_offload(model) is handle
        assert all(p.exists() for p in handle._placement.store.written)  # type: ignore[union-attr]
        assert all(t.device.type != "meta" for t in model.state_dict().values())
        backend.fixed = True
        handle.remove()  # restores what is left
    assert handle.removed and find_offload(model) is None
    assert not folder.exists(), "its files are deleted once every group is back"
    with torch.no_grad():
        assert torch.equal(model(**x), ref)


def test_a_platform_error_during_a_forward_leaves_the_offload_usable(tmp_path):  # type: ignore[no-untyped-def]
    x, ref = reference("bf16")
    model = make_model("bf16")
    backend = MissingCall()
    tier = DiskTier(str(tmp_path / "ferry"), cpu_read="copy")
    with using(backend):
        handle = apply_offload(model, OffloadPolicy(tier=tier), onload_device="cpu")
        with torch.no_grad(), pytest.raises(AttributeError):
            model(**x)
        backend.fixed = True
        with torch.no_grad():
            outs = [model(**x) for _ in range(2)]
        handle.remove()
    assert all(torch.equal(o, ref) for o in outs)


def test_the_disk_tier_names_its_read_backend_in_the_notes(tmp_path):  # type: ignore[no-untyped-def]
    model = make_model("bf16")
    tier = DiskTier(str(tmp_path / "ferry"), cpu_read="copy")
    with using(PortableFiles()):
        handle = apply_offload(model, OffloadPolicy(tier=tier), onload_device="cpu")
        notes = handle.stats().notes
        handle.remove()
    assert any(n.startswith("disk reads: positioned reads as seek + readinto") for n in notes), (
        notes
    )


@pytest.mark.parametrize(
    "typed",
    [r"C:\ComfyUI\temp\ferry", "D:/ferry", r"\\nas\share\ferry", r"\\?\C:\very\long\ferry"],
)
def test_windows_full_paths_are_accepted(typed: str) -> None:
    assert parse_disk_path(f"  {typed} ", flavour=ntpath) == typed


@pytest.mark.parametrize("typed", ["ferry", r"C:ferry", r"temp\ferry"])
def test_windows_relative_paths_are_refused(typed: str) -> None:
    with pytest.raises(ConfigError, match="disk_path: use a full path"):
        parse_disk_path(typed, flavour=ntpath)


def test_long_windows_paths_take_the_extended_form() -> None:
    short = r"C:\ferry"
    deep = "C:\\" + "\\".join(["folder"] * 30)
    share = "\\\\nas\\share\\" + "\\".join(["folder"] * 30)
    assert long_path(short, windows=True, flavour=ntpath) == short
    assert long_path(deep, windows=True, flavour=ntpath) == "\\\\?\\" + deep
    assert long_path(share, windows=True, flavour=ntpath) == "\\\\?\\UNC\\nas\\share\\" + share[12:]
    assert long_path("\\\\?\\" + deep, windows=True, flavour=ntpath) == "\\\\?\\" + deep
    assert long_path("/" + "/".join(["folder"] * 40), windows=False) == "/" + "/".join(
        ["folder"] * 40
    )


def test_a_stale_folders_owner_is_asked_about_without_signalling_it() -> None:
    assert _pid_alive(os.getpid())
    assert not _pid_alive(-1) and not _pid_alive(0)
    assert not _pid_alive(2**22 + 12345)  # above Linux's pid_max default: never a process


def test_files_is_chosen_once() -> None:
    assert files_module.files() is files_module.files()


def test_a_damaged_torchao_group_is_dropped_to_meta_without_crashing(tmp_path):  # type: ignore[no-untyped-def]
    """Dropping a group asks each tensor's layout, not the tensor: torchao's subclasses
    refuse ``empty_like`` with pinned memory (what crashed main's remove() under the Windows
    stand-in, after a missing call had been taken for damage)."""
    pytest.importorskip("torchao")
    x, ref = reference("bf16", "int8")
    model = make_model("bf16", "int8")
    tier = DiskTier(str(tmp_path / "ferry"), cpu_read="copy")
    handle = apply_offload(model, OffloadPolicy(tier=tier), onload_device="cpu")
    with torch.no_grad():
        assert torch.equal(model(**x), ref)
    group_files = sorted((tmp_path / "ferry").rglob("group-*.safetensors"))
    flip_byte(group_files[1])  # in place, as Windows allows on an open file
    with pytest.raises(WeightsLostError, match="meta device"):
        handle.remove()
    lost = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    quantized = [n for n, p in model.named_parameters() if type(p.data).__name__ != "Tensor"]
    assert set(lost) & set(quantized), "a quantized weight among them, kept as its subclass"
    assert handle.removed and not (tmp_path / "ferry").exists()


def test_windows_descriptor_cap_is_said_before_anything_is_written(monkeypatch):  # type: ignore[no-untyped-def]
    from offload_core.disk import portable

    monkeypatch.setattr(portable.sys, "platform", "win32")
    PortableFiles().reserve_descriptors(3000)  # within Windows' 8192: nothing to say
    with pytest.raises(ConfigError, match=r"level: .*Windows allows 8192.*choose block level"):
        PortableFiles().reserve_descriptors(9000)


def test_a_group_file_held_by_another_program_never_fails_remove(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """Windows refuses to delete a file another handle holds (an antivirus scan, a viewer):
    remove() still completes with the model back, leaves that file with Ferry's marker
    ("leftover"), the next layout takes another folder while it is held, and the one after
    it is released reclaims it. The refusal is Windows' own error, raised here by a patched
    os.unlink for the held file (on every platform this test runs on)."""
    import json

    x, ref = reference("bf16")
    model = make_model("bf16")
    tier = DiskTier(str(tmp_path), cpu_read="copy")
    handle = apply_offload(model, OffloadPolicy(tier=tier), onload_device="cpu")
    folder = handle._placement.store.folder  # type: ignore[union-attr]
    held = sorted(folder.glob("group-*.safetensors"))[0]
    real_unlink = os.unlink

    def windows_unlink(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if os.fspath(path) == str(held):
            raise PermissionError(13, "[WinError 32] in use by another process", str(held))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", windows_unlink)
    handle.remove()  # no error: the model is back
    with torch.no_grad():
        assert torch.equal(model(**x), ref)
    assert (
        held.exists() and json.loads((folder / ".ferry-owned").read_text())["state"] == "leftover"
    )
    assert not (set(folder.glob("group-*.safetensors")) - {held}), "the rest were deleted"

    second = apply_offload(model, OffloadPolicy(tier=tier), onload_device="cpu")
    other = second._placement.store.folder  # type: ignore[union-attr]
    assert other != folder, "a held file's folder is not rewritten while held"
    with torch.no_grad():
        assert torch.equal(model(**x), ref)
    second.remove()

    monkeypatch.setattr(os, "unlink", real_unlink)  # the other program let go
    third = apply_offload(model, OffloadPolicy(tier=tier), onload_device="cpu")
    third.remove()
    assert not folder.exists() and not other.exists(), "the leftover was reclaimed, all deleted"


def test_a_stand_in_reaches_child_processes() -> None:
    """Under a stand-in (bash run.sh platforms), the processes tests start (the memory-limit
    workers, ComfyUI-free node checks) run under it too, from any folder."""
    import subprocess
    import sys

    standin = os.environ.get("FERRY_PLATFORM_STANDIN")
    if not standin:
        pytest.skip("not under a platform stand-in")
    code = "import os, mmap; print(hasattr(os, 'preadv'), hasattr(os, 'O_DIRECT'), hasattr(mmap, 'MADV_DONTNEED'))"
    out = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True)
    want = {"windows": "False False False", "macos": "True False False"}[standin]
    assert out.stdout.strip() == want, out.stdout + out.stderr
