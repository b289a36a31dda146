"""Stream ordering, proven on a CPU: the engine's own schedule through fake streams fed to
PyTorch's CUDA-Sanitizer happens-before engine (tests/sanitizer_backend.py)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from offload_core import (
    BlockLevel,
    DiskTier,
    LeafLevel,
    OffloadPolicy,
    PinnedRamTier,
    apply_offload,
)
from offload_core import api as apply_mod
from offload_core.model.demo import build_demo_model, demo_inputs
from offload_core.transfer.copies import Transfers
from tests.helpers import make_uneven_model
from tests.sanitizer_backend import ComputeKernels, SanitizerBackend


def _run(monkeypatch, tmp_path, tier, depth, drop=None, level=None, forwards=3, uneven=False):
    backend = SanitizerBackend(drop)
    monkeypatch.setattr(apply_mod, "backend_for", lambda device: backend)
    if uneven:
        model, x = make_uneven_model()
    else:
        model = build_demo_model(0.004, torch.float32, seed=1)
        x = demo_inputs(model, tokens=8)
    with torch.no_grad():
        ref = model(**x)
    if tier == "disk-ckpt":  # groups read from the model's own checkpoint: window reads
        ckpt = tmp_path / "model.safetensors"
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(ckpt))
        tier = DiskTier(str(tmp_path / "ferry"), source_checkpoint=str(ckpt))
    else:
        tier = DiskTier(str(tmp_path)) if tier == "disk" else PinnedRamTier()
    policy = OffloadPolicy(level=level or BlockLevel(1), tier=tier, prefetch_depth=depth)
    handle = apply_offload(model, policy, onload_device="cpu")
    outs = []
    try:
        with torch.no_grad(), ComputeKernels(backend):
            for _ in range(forwards):
                outs.append(model(**x))
    finally:
        handle.remove()
    return backend, ref, outs


@pytest.mark.parametrize("tier", ["pinned", "disk"])
@pytest.mark.parametrize("depth", [1, 2])
def test_schedule_has_no_race(monkeypatch, tmp_path, tier, depth):
    backend, ref, outs = _run(monkeypatch, tmp_path, tier, depth)
    assert backend.errors == [], "\n".join(map(str, backend.errors[:3]))
    assert all(torch.equal(o, ref) for o in outs)
    # The schedule really crossed streams: both stream waits happened, many times.
    assert backend.waits["compute-waits-copy"] > 20
    assert backend.waits["copy-waits-compute"] > 20
    if tier == "disk":
        assert backend.waits["host-waits-copy"] > 20


def test_leaf_level_schedule_has_no_race(monkeypatch, tmp_path):
    backend, ref, outs = _run(monkeypatch, tmp_path, "disk", 2, level=LeafLevel())
    assert backend.errors == []
    assert all(torch.equal(o, ref) for o in outs)


@pytest.mark.parametrize(
    "drop,tier",
    [
        ("compute-waits-copy", "pinned"),
        ("copy-waits-compute", "pinned"),
        ("compute-waits-copy", "disk"),
        ("copy-waits-compute", "disk"),
        ("host-waits-copy", "disk"),
    ],
)
@pytest.mark.parametrize("depth", [1, 2])
def test_checker_has_teeth(monkeypatch, tmp_path, drop, tier, depth):
    """Each of the three waits, removed alone, is reported as a race."""
    backend, _, _ = _run(monkeypatch, tmp_path, tier, depth, drop=drop)
    assert backend.errors, f"removing {drop} went unnoticed"


@pytest.mark.parametrize("tier", ["pinned", "disk"])
def test_remove_waits_for_the_copies_it_dropped(monkeypatch, tmp_path, tier):
    """After a forward the next forward's first groups are already being copied in;
    remove() drops them, and their host buffers (slabs, staging) are released next. Without
    ``Transfers.settle`` the release (a host write: the memory goes back) races the copy."""
    backend, ref, outs = _run(monkeypatch, tmp_path, tier, 2)
    assert backend.errors == [] and all(torch.equal(o, ref) for o in outs)
    monkeypatch.setattr(Transfers, "settle", lambda self: None)
    backend, _, _ = _run(monkeypatch, tmp_path / "unsettled", tier, 2)
    assert backend.errors, "a release under an unfinished copy went unnoticed"


def _count_overlaps(monkeypatch) -> list[int]:
    """How many released regions' events each copy into the ring waits on (wait 2)."""
    seen: list[int] = []
    real = Transfers._overlapped

    def spy(self, slot):
        events = real(self, slot)
        seen.append(len(events))
        return events

    monkeypatch.setattr(Transfers, "_overlapped", spy)
    return seen


@pytest.mark.parametrize("tier", ["pinned", "disk"])
@pytest.mark.parametrize("depth", [1, 2])
def test_uneven_leaf_groups_share_the_ring_without_a_race(monkeypatch, tmp_path, tier, depth):
    """Groups of very different sizes: small ones packed into one slot, a bigger region
    later over several of them, each copy waiting on every overlapped group's compute."""
    overlaps = _count_overlaps(monkeypatch)
    backend, ref, outs = _run(
        monkeypatch, tmp_path, tier, depth, level=LeafLevel(), forwards=4, uneven=True
    )
    assert backend.errors == [], "\n".join(map(str, backend.errors[:3]))
    assert all(torch.equal(o, ref) for o in outs)
    assert max(overlaps) >= 2, "some region lay over two or more released ones"
    assert backend.waits["copy-waits-compute"] > 20


@pytest.mark.parametrize(
    "drop,tier",
    [
        ("compute-waits-copy", "pinned"),
        ("copy-waits-compute", "pinned"),
        ("copy-waits-compute", "disk"),
        ("host-waits-copy", "disk"),
        ("only-the-oldest-overlapped", "pinned"),
        ("only-the-oldest-overlapped", "disk"),
    ],
)
def test_checker_has_teeth_on_the_ring(monkeypatch, tmp_path, drop, tier):
    """On uneven groups, each wait removed alone is a race; so is waiting on only one of the
    compute-done events of the regions a new region overlaps."""
    if drop == "only-the-oldest-overlapped":
        real = Transfers._overlapped
        monkeypatch.setattr(Transfers, "_overlapped", lambda self, slot: real(self, slot)[:1])
        drop = None
    backend, _, _ = _run(
        monkeypatch, tmp_path, tier, 1, drop=drop, level=LeafLevel(), forwards=3, uneven=True
    )
    assert backend.errors, f"removing {drop} went unnoticed"


@pytest.mark.parametrize("depth", [1, 2])
def test_window_reads_through_staging_have_no_race(monkeypatch, tmp_path, depth):
    """A group read from the checkpoint lands in its staging buffer piece by piece, copied
    out of the bounce buffers on other threads ([Note: the window read]); the copy stream
    must still see every byte written before it copies (wait 3 and the read's own join)."""
    from offload_core.disk import reader as window_read

    calls: list[int] = []
    real = window_read.read_window

    def counted(*args):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*args)

    monkeypatch.setattr("offload_core.disk.reader.read_window", counted)
    backend, ref, outs = _run(monkeypatch, tmp_path, "disk-ckpt", depth)
    assert backend.errors == [], "\n".join(map(str, backend.errors[:3]))
    assert all(torch.equal(o, ref) for o in outs)
    assert len(calls) > 5, "the groups after the first forward read windows"
    assert backend.waits["host-waits-copy"] > 10
