"""The one reader makes every file call through disk/files.py's ``FileBackend``: a platform's
backend is one class (disk/posix.py; a Windows one beside it), chosen in ``files()``. This
test's backend is a second one: POSIX reads without O_DIRECT (as a filesystem that refuses it
gives), counting what it is asked. Offloads read through it give the resident output, and
no read goes around it."""

from __future__ import annotations

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
from offload_core.disk.files import files, using
from offload_core.disk.posix import PosixFiles
from offload_core.tools.demo_model import DemoDiT
from tests.helpers import make_model, reference


class BufferedOnly:
    """POSIX positioned reads, no unbuffered descriptor ever."""

    has_direct = False

    def __init__(self) -> None:
        self.posix = PosixFiles()
        self.calls: Counter[str] = Counter()

    def open(self, path: Path) -> int:
        self.calls["open"] += 1
        return self.posix.open(path)

    def open_direct(self, path: Path) -> int | None:
        self.calls["open_direct"] += 1
        return None

    def pread(self, fd: int, into: memoryview, offset: int) -> int:
        self.calls["pread"] += 1
        return self.posix.pread(fd, into, offset)

    def pread_direct(self, fd: int, into: memoryview, offset: int) -> int | None:
        raise AssertionError("no unbuffered descriptor was given out, none may be read")

    def reserve_descriptors(self, count: int) -> None:
        self.calls["reserve_descriptors"] += 1


def _checkpoint(model: torch.nn.Module, path: Path) -> Path:
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


@pytest.mark.parametrize("level", [BlockLevel(1), LeafLevel()], ids=["block", "leaf"])
@pytest.mark.parametrize("read", ["group_file", "checkpoint"])
def test_an_offload_reads_through_another_backend_and_equals_resident(tmp_path, level, read):  # type: ignore[no-untyped-def]
    x, ref = reference("bf16")
    model = make_model("bf16")
    ckpt = _checkpoint(model, tmp_path / "m.safetensors") if read == "checkpoint" else None
    tier = DiskTier(str(tmp_path / "ferry"), source_checkpoint=ckpt and str(ckpt), cpu_read="copy")
    with using(BufferedOnly()) as backend:
        handle = apply_offload(model, OffloadPolicy(level=level, tier=tier), onload_device="cpu")
        assert handle._engine is not None
        plans = [g.source.plan for g in handle._engine.groups]  # type: ignore[attr-defined]
        with torch.no_grad():
            outs = [model(**x) for _ in range(3)]
        handle.remove()
    assert all(torch.equal(o, ref) for o in outs)
    assert all(p.direct_fd == -1 for p in plans)
    assert all(p.owned == (read == "group_file") for p in plans)
    assert backend.calls["open"] >= len(plans) and backend.calls["open_direct"] >= len(plans)
    assert backend.calls["pread"] >= 3 * len(plans), backend.calls
    assert backend.calls["reserve_descriptors"] == 1
    assert isinstance(files(), PosixFiles), "the platform's backend is back after the block"


def test_a_model_loaded_from_its_checkpoint_reads_through_another_backend(tmp_path):  # type: ignore[no-untyped-def]
    x, ref = reference("bf16")
    model = make_model("bf16")
    ckpt = _checkpoint(model, tmp_path / "m.safetensors")
    dim, nd, ns = model.dim, len(model.double_blocks), len(model.single_blocks)  # type: ignore[arg-type]

    def build(dev: torch.device) -> torch.nn.Module:
        return DemoDiT(dim, max(dim // 64, 1), nd, ns).to(torch.bfloat16).eval()

    policy = OffloadPolicy(tier=DiskTier(str(tmp_path / "ferry"), cpu_read="copy"))
    with using(BufferedOnly()) as backend:
        handle = load_offloaded(ckpt, build, policy)
        with torch.no_grad():
            outs = [handle.model(**x) for _ in range(2)]
        handle.remove()
    assert all(torch.equal(o, ref) for o in outs)
    # Every tensor of the file was read through it at apply (the index's tensor reads), and
    # every group again at each forward (the reader's).
    assert backend.calls["pread"] >= len(model.state_dict()), backend.calls
