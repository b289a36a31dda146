"""The one reader makes every file call through disk/files.py's ``FileBackend``: a platform's
backend is one class (disk/posix.py, disk/portable.py), chosen in ``files()``. This test's
backend wraps one of them without O_DIRECT (as a filesystem that refuses it gives), counting
what it is asked. Offloads read through it give the resident output, and
no read goes around it."""

from __future__ import annotations

import mmap
import os
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from offload_core import (
    BlockLevel,
    DiskTier,
    LeafLevel,
    OffloadPolicy,
    apply_offload,
    load_offloaded,
)
from offload_core.disk.files import FileBackend, files, platform_backend, using
from offload_core.disk.portable import PortableFiles
from offload_core.disk.posix import PosixFiles
from offload_core.model.demo import DemoDiT
from tests.helpers import make_model, reference


class BufferedOnly:
    """A platform's positioned reads, no unbuffered descriptor ever, each call counted."""

    has_direct = False

    def __init__(self, inner: FileBackend | None = None) -> None:
        self.inner = inner or PosixFiles()
        self.name = f"counting {self.inner.name}"
        self.maps_groups, self.huge_pages = self.inner.maps_groups, self.inner.huge_pages
        self.calls: Counter[str] = Counter()

    def open(self, path: Path) -> int:
        self.calls["open"] += 1
        return self.inner.open(path)

    def open_direct(self, path: Path) -> int | None:
        self.calls["open_direct"] += 1
        return None

    def pread(self, fd: int, into: memoryview, offset: int) -> int:
        self.calls["pread"] += 1
        return self.inner.pread(fd, into, offset)

    def pread_direct(self, fd: int, into: memoryview, offset: int) -> int | None:
        raise AssertionError("no unbuffered descriptor was given out, none may be read")

    def reserve_descriptors(self, count: int) -> None:
        self.calls["reserve_descriptors"] += 1

    def advise_huge(self, mapping: mmap.mmap, start: int, length: int) -> None:
        self.inner.advise_huge(mapping, start, length)

    def populate(self, mapping: mmap.mmap, length: int) -> None:
        self.inner.populate(mapping, length)

    def drop_pages(self, mapping: mmap.mmap, length: int) -> None:
        self.inner.drop_pages(mapping, length)


#: The backends a test reads through: POSIX's calls (where this Python has them) and the
#: portable one (Windows' way: no os.preadv), each counted.
INNER = ["posix", "portable"]


def _inner(kind: str) -> FileBackend:
    if kind == "posix" and not hasattr(os, "preadv"):
        pytest.skip("this Python has no os.preadv (a platform stand-in)")
    return PosixFiles() if kind == "posix" else PortableFiles()


def _checkpoint(model: torch.nn.Module, path: Path) -> Path:
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


@pytest.mark.parametrize("level", [BlockLevel(1), LeafLevel()], ids=["block", "leaf"])
@pytest.mark.parametrize("read", ["group_file", "checkpoint"])
@pytest.mark.parametrize("inner", INNER)
def test_an_offload_reads_through_another_backend_and_equals_resident(tmp_path, level, read, inner):  # type: ignore[no-untyped-def]
    x, ref = reference("bf16")
    model = make_model("bf16")
    ckpt = _checkpoint(model, tmp_path / "m.safetensors") if read == "checkpoint" else None
    tier = DiskTier(str(tmp_path / "ferry"), source_checkpoint=ckpt and str(ckpt), cpu_read="copy")
    with using(BufferedOnly(_inner(inner))) as backend:
        handle = apply_offload(model, OffloadPolicy(level=level, tier=tier), onload_device="cpu")
        assert handle._engine is not None
        plans = [g.source.file_plan for g in handle._engine.groups]
        with torch.no_grad():
            outs = [model(**x) for _ in range(3)]
        handle.remove()
    assert all(torch.equal(o, ref) for o in outs)
    assert all(p.direct_fd == -1 for p in plans)
    assert all(p.owned == (read == "group_file") for p in plans)
    assert backend.calls["open"] >= len(plans) and backend.calls["open_direct"] >= len(plans)
    assert backend.calls["pread"] >= 3 * len(plans), backend.calls
    assert backend.calls["reserve_descriptors"] == 1
    assert type(files()) is type(platform_backend()), "the platform's backend is back after it"


@pytest.mark.parametrize("inner", INNER)
def test_a_model_loaded_from_its_checkpoint_reads_through_another_backend(tmp_path, inner):  # type: ignore[no-untyped-def]
    x, ref = reference("bf16")
    model = make_model("bf16")
    ckpt = _checkpoint(model, tmp_path / "m.safetensors")
    dim, nd, ns = model.dim, len(model.double_blocks), len(model.single_blocks)  # type: ignore[arg-type]

    def build(dev: torch.device) -> torch.nn.Module:
        return DemoDiT(dim, max(dim // 64, 1), nd, ns).to(torch.bfloat16).eval()

    policy = OffloadPolicy(tier=DiskTier(str(tmp_path / "ferry"), cpu_read="copy"))
    with using(BufferedOnly(_inner(inner))) as backend:
        handle = load_offloaded(ckpt, build, policy)
        with torch.no_grad():
            outs = [handle.model(**x) for _ in range(2)]
        handle.remove()
    assert all(torch.equal(o, ref) for o in outs)
    # Every tensor of the file was read through it at apply (the index's tensor reads), and
    # every group again at each forward (the reader's).
    assert backend.calls["pread"] >= len(model.state_dict()), backend.calls
