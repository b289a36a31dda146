"""Stream ordering, proven on a CPU: the engine's own schedule through fake streams fed to
PyTorch's CUDA-Sanitizer happens-before engine (tests/sanitizer_backend.py)."""

from __future__ import annotations

import pytest
import torch

from offload_core import (
    BlockLevel,
    DiskTier,
    LeafLevel,
    OffloadPolicy,
    PinnedRamTier,
    apply_offload,
)
from offload_core import api as apply_mod
from offload_core.tools.demo_model import build_demo_model, demo_inputs
from tests.sanitizer_backend import ComputeKernels, SanitizerBackend


def _run(monkeypatch, tmp_path, tier, depth, drop=None, level=None, forwards=3):
    backend = SanitizerBackend(drop)
    monkeypatch.setattr(apply_mod, "backend_for", lambda device: backend)
    model = build_demo_model(0.004, torch.float32, seed=1)
    x = demo_inputs(model, tokens=8)
    with torch.no_grad():
        ref = model(**x)
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
