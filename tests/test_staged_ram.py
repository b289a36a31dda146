"""The RAM tier through pinned staging ([Note: the RAM tier through staging] in
transfer/copies.py), proven on a CPU: the engine's schedule through fake streams fed to
PyTorch's CUDA-Sanitizer engine (tests/sanitizer_backend.py), with a slowed copy stream and a
slowed host thread, and the mutation that drops wait 3 for memory sources caught."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from offload_core import BlockLevel, LeafLevel, OffloadPolicy, PinnedRamTier, RamTier, apply_offload
from offload_core import api as apply_mod
from offload_core.disk.reader import Reader, copy_pieces
from offload_core.model.demo import build_demo_model, demo_inputs
from offload_core.transfer.copies import Transfers
from tests.sanitizer_backend import ComputeKernels, SanitizerBackend


def _run(
    monkeypatch: pytest.MonkeyPatch,
    tier: Any,
    depth: int = 2,
    backend: SanitizerBackend | None = None,
    level: Any = None,
    forwards: int = 3,
) -> tuple[SanitizerBackend, torch.Tensor, list[torch.Tensor], dict[str, int], list[str]]:
    backend = backend or SanitizerBackend()
    monkeypatch.setattr(apply_mod, "backend_for", lambda device: backend)
    counts = {"staged": 0, "direct": 0}
    real_copy_in = Reader.copy_in
    real_copy_slab = Transfers.copy_slab

    def copy_in(self: Reader, src: torch.Tensor, dst: torch.Tensor, nbytes: int) -> None:
        counts["staged"] += 1
        real_copy_in(self, src, dst, nbytes)

    def copy_slab(self: Transfers, slot: Any, slab: Any, nbytes: int, pinned: bool = True) -> Any:
        if pinned or not self.stages_memory:
            counts["direct"] += 1
        return real_copy_slab(self, slot, slab, nbytes, pinned)

    monkeypatch.setattr(Reader, "copy_in", copy_in)
    monkeypatch.setattr(Transfers, "copy_slab", copy_slab)
    model = build_demo_model(0.004, torch.float32, seed=1)
    x = demo_inputs(model, tokens=8)
    with torch.no_grad():
        ref = model(**x)
    policy = OffloadPolicy(level=level or BlockLevel(1), tier=tier, prefetch_depth=depth)
    handle = apply_offload(model, policy, onload_device="cpu")
    notes = list(handle._placement.notes)
    outs = []
    try:
        with torch.no_grad(), ComputeKernels(backend):
            for _ in range(forwards):
                outs.append(model(**x))
    finally:
        handle.remove()
    return backend, ref, outs, counts, notes


@pytest.mark.parametrize("slow", [None, "copy", "host"])
@pytest.mark.parametrize("depth", [1, 2])
def test_staged_ram_tier_has_no_race(monkeypatch, depth, slow):
    """Every group of the RAM tier goes through the staging ring, and the schedule has no
    race, whichever side is slow."""
    backend, ref, outs, counts, _ = _run(
        monkeypatch, RamTier(), depth, SanitizerBackend(slow=slow, delay=0.003)
    )
    assert backend.errors == [], "\n".join(map(str, backend.errors[:3]))
    assert all(torch.equal(o, ref) for o in outs)
    assert counts["staged"] > 20 and counts["direct"] == 0, counts
    assert backend.waits["host-waits-copy"] > 20  # wait 3, for memory sources
    assert backend.waits["compute-waits-copy"] > 20
    assert backend.waits["copy-waits-compute"] > 20


def test_staged_ram_leaf_level_has_no_race(monkeypatch):
    backend, ref, outs, counts, _ = _run(monkeypatch, RamTier(), 2, level=LeafLevel())
    assert backend.errors == []
    assert all(torch.equal(o, ref) for o in outs)
    assert counts["staged"] > 20


@pytest.mark.parametrize("slow", [None, "copy", "host"])
@pytest.mark.parametrize("drop", ["host-waits-copy", "copy-waits-compute", "compute-waits-copy"])
def test_checker_has_teeth_on_staged_ram(monkeypatch, drop, slow):
    """The mutation "drop wait 3 for memory sources" (the RAM tier has no other source) is
    reported as a race, as are the other two waits."""
    backend, _, _, counts, _ = _run(monkeypatch, RamTier(), 2, SanitizerBackend(drop, slow))
    assert counts["staged"] > 0
    assert backend.errors, f"removing {drop} went unnoticed"


def test_dropping_wait3_only_for_memory_sources_is_caught(monkeypatch):
    """The mutation in the engine itself: ``_staged`` skips wait 3 when it stages a slab
    (the disk's reads keep it); the sanitizer reports it."""
    real = Transfers._staged
    backend = SanitizerBackend()

    def mutated(self: Transfers, fill: Any, nbytes: int, slot: Any, frees: list[Any]) -> Any:
        if getattr(fill, "func", None) is not None and fill.func.__name__ == "copy_in":
            for st in self.stagings:
                st.free = None  # forgets the last copy out of every staging buffer
        return real(self, fill, nbytes, slot, frees)

    monkeypatch.setattr(Transfers, "_staged", mutated)
    backend, _, _, counts, _ = _run(monkeypatch, RamTier(), 2, backend)
    assert counts["staged"] > 0
    assert backend.errors, "dropping wait 3 for memory sources went unnoticed"


class _CappedPins(SanitizerBackend):
    """Refuses to pin past ``cap`` bytes, as a system that caps page-locked memory does."""

    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap
        self.pinned = 0

    def empty_host(self, nbytes: int, pinned: bool) -> torch.Tensor:
        if pinned:
            if self.pinned + nbytes > self.cap:
                raise RuntimeError("pinning failed (CUDA error 2)")
            self.pinned += nbytes
        return super().empty_host(nbytes, pinned)


@pytest.mark.parametrize("how", ["pin_limit", "system"])
def test_pinned_tier_past_its_limit_is_staged(monkeypatch, how):
    """The pinned tier's groups under the pin limit copy straight from their pinned slabs,
    the rest through the staging ring; no race, output exact, the plan says so."""
    probe = build_demo_model(0.004, torch.float32, seed=1)
    half = sum(p.numel() * p.element_size() for p in probe.parameters()) // 2
    if how == "pin_limit":
        tier, backend = PinnedRamTier(pin_limit=half), SanitizerBackend()
    else:
        tier, backend = PinnedRamTier(), _CappedPins(half)
    backend, ref, outs, counts, notes = _run(monkeypatch, tier, 2, backend)
    assert backend.errors == []
    assert all(torch.equal(o, ref) for o in outs)
    assert counts["staged"] > 0 and counts["direct"] > 0, counts
    assert any("past the pin limit" in n for n in notes), notes


def test_pinned_tier_under_its_limit_is_not_staged(monkeypatch):
    backend, ref, outs, counts, notes = _run(monkeypatch, PinnedRamTier(), 2)
    assert backend.errors == [] and all(torch.equal(o, ref) for o in outs)
    assert counts["staged"] == 0 and counts["direct"] > 0
    assert not any("pin limit" in n for n in notes)


def test_cpu_path_unchanged(monkeypatch):
    """On a CPU (no device copy) the RAM tier copies each slab into its slot as before: no
    staging buffers, nothing staged."""
    calls = {"staged": 0}
    real = Reader.copy_in

    def copy_in(self: Reader, src: torch.Tensor, dst: torch.Tensor, nbytes: int) -> None:
        calls["staged"] += 1
        real(self, src, dst, nbytes)

    monkeypatch.setattr(Reader, "copy_in", copy_in)
    model = build_demo_model(0.004, torch.float32, seed=1)
    x = demo_inputs(model, tokens=8)
    with torch.no_grad():
        ref = model(**x)
    handle = apply_offload(model, OffloadPolicy(tier=RamTier()), onload_device="cpu")
    try:
        assert handle._engine is not None and handle._engine.transfers.stagings == []
        with torch.no_grad():
            assert torch.equal(model(**x), ref)
    finally:
        handle.remove()
    assert calls["staged"] == 0


def test_pin_limit_is_validated():
    from offload_core import ConfigError

    with pytest.raises(ConfigError, match="pin_limit"):
        PinnedRamTier(pin_limit=-1).validate()


@pytest.mark.parametrize("nbytes", [0, 1, 4 << 20, (16 << 20) + 3, 100 << 20])
@pytest.mark.parametrize("threads", [1, 4])
def test_copy_in_copies_every_byte(nbytes, threads):
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
    dst = torch.zeros(nbytes + 64, dtype=torch.uint8)

    class _Clock:
        def read_started(self) -> None: ...
        def read_finished(self, nbytes: int) -> None: ...

    reader = Reader(_Clock(), threads)
    try:
        reader.copy_in(src, dst, nbytes)
    finally:
        reader.close()
    assert torch.equal(dst[:nbytes], src) and not dst[nbytes:].any()
    pieces = copy_pieces(nbytes, threads)
    assert sum(n for _, n in pieces) == nbytes and all(o % 64 == 0 for o, _ in pieces)
