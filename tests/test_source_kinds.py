"""Adding a weight source is one file plus one registration (docs/architecture.md, "Adding a
weight source"): tests/zlib_source.py, registered around an offload, carries every group of a
RAM-tier offload; outputs equal the resident model's, streams are ordered (the sanitizer
backend), and remove gives the model back as it was."""

from __future__ import annotations

import pytest
import torch

from offload_core import BlockLevel, LeafLevel, OffloadPolicy, RamTier, apply_offload
from offload_core import api as apply_mod
from offload_core.sources import kinds
from offload_core.sources.host_slab import HostSlabSource
from tests.helpers import make_model, reference, snapshot, state_equal
from tests.sanitizer_backend import ComputeKernels, SanitizerBackend
from tests.zlib_source import ZlibSource, zlib_kind


@pytest.mark.parametrize("level", [BlockLevel(1), LeafLevel()])
def test_a_registered_source_carries_the_groups_and_equals_resident(level):  # type: ignore[no-untyped-def]
    x, ref = reference("bf16")
    model = make_model("bf16")
    before = snapshot(model)
    with kinds.registered("zlib", zlib_kind):
        handle = apply_offload(
            model, OffloadPolicy(level=level, tier=RamTier()), onload_device="cpu"
        )
    engine = handle._engine
    assert engine is not None and engine.groups
    assert all(isinstance(g.source, ZlibSource) for g in engine.groups)
    with torch.no_grad():
        outs = [model(**x) for _ in range(3)]
    handle.remove()
    assert all(torch.equal(o, ref) for o in outs)
    after = snapshot(model)
    assert state_equal(before[0], after[0]) and before[1] == after[1]


def test_a_registered_source_keeps_the_streams_ordered(monkeypatch):  # type: ignore[no-untyped-def]
    backend = SanitizerBackend()
    monkeypatch.setattr(apply_mod, "backend_for", lambda device: backend)
    x, ref = reference("fp32")
    model = make_model("fp32")
    with kinds.registered("zlib", zlib_kind):
        handle = apply_offload(
            model, OffloadPolicy(tier=RamTier(), prefetch_depth=2), onload_device="cpu"
        )
    try:
        with torch.no_grad(), ComputeKernels(backend):
            outs = [model(**x) for _ in range(3)]
    finally:
        handle.remove()
    assert backend.errors == [], "\n".join(map(str, backend.errors[:3]))
    assert all(torch.equal(o, ref) for o in outs)
    assert backend.waits["compute-waits-copy"] > 10


def test_the_registration_ends_with_its_block():
    model = make_model("fp32")
    with kinds.registered("zlib", zlib_kind):
        assert next(n for n, _ in kinds.KINDS) == "zlib"
    assert "zlib" not in [n for n, _ in kinds.KINDS]
    handle = apply_offload(model, OffloadPolicy(tier=RamTier()), onload_device="cpu")
    assert all(isinstance(g.source, HostSlabSource) for g in handle._engine.groups)  # type: ignore[union-attr]
    handle.remove()
