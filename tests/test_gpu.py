"""The GPU half: real streams, the real CUDA Sanitizer, and races provoked with _sleep.
Skipped without CUDA; `bash tools/gpu_suite.sh` runs it on a lent GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from offload_core import (
    BlockLevel,
    CompiledBlocks,
    CompileSettings,
    DiskTier,
    LeafLevel,
    OffloadPolicy,
    PinnedRamTier,
    RamTier,
    apply_offload,
)
from offload_core.transfer import streams as backend_mod
from tests.helpers import make_model, snapshot, state_equal

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]
REPO = Path(__file__).resolve().parents[1]
SLEEP_CYCLES = 20_000_000  # ~10 ms on an H100: far longer than a small group's copy


def _ref(dtype, quant="plain"):
    from offload_core.model.demo import demo_inputs

    model = make_model(dtype, quant)
    x = demo_inputs(model, tokens=64, seed=3, device="cuda")
    model.to("cuda")
    with torch.no_grad():
        ref = model(**x).clone()
    model.to("cpu")
    return model, x, ref


@pytest.mark.parametrize("quant", ["plain", "int8", "float8"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("tier", ["pinned", "ram", "disk"])
@pytest.mark.parametrize("level", ["block", "leaf"])
def test_cuda_equivalence(tmp_path, level, tier, dtype, quant):
    model, x, ref = _ref(dtype, quant)
    before, ids, _ = snapshot(model)
    tiers = {"pinned": PinnedRamTier(), "ram": RamTier(), "disk": DiskTier(str(tmp_path))}
    lv = BlockLevel(1) if level == "block" else LeafLevel()
    handle = apply_offload(
        model, OffloadPolicy(level=lv, tier=tiers[tier], prefetch_depth=2), onload_device="cuda"
    )
    with torch.no_grad():
        outs = [model(**x).clone() for _ in range(3)]
    torch.cuda.synchronize()
    handle.remove()
    assert all(torch.equal(o, ref) for o in outs)
    after, ids_after, _ = snapshot(model)
    assert ids_after == ids and state_equal(before, after)


@pytest.mark.parametrize("tier", ["pinned", "disk"])
def test_cuda_compiled_resident_and_compiled_ferry(tmp_path, tier):
    """The suite's two compile rows: the blocks compiled resident on the GPU (the reference),
    then the same compiled blocks with Ferry streaming their weights (prefetch 2: copies
    overlap the compiled compute). Equal bit for bit, and dynamo compiles nothing more once
    the weights stream ([Note: compiling with Ferry])."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model, x, _ = _ref("bf16")
    model.to("cuda")
    with CompiledBlocks(model, CompileSettings(backend="inductor")):
        with torch.no_grad():
            ref = model(**x).clone()
        first = counters["stats"]["unique_graphs"]
        model.to("cpu")
        tiers = {"pinned": PinnedRamTier(), "disk": DiskTier(str(tmp_path))}
        policy = OffloadPolicy(level=BlockLevel(1), tier=tiers[tier], prefetch_depth=2)
        handle = apply_offload(model, policy, onload_device="cuda")
        with torch.no_grad():
            outs = [model(**x).clone() for _ in range(3)]
        torch.cuda.synchronize()
        stats = handle.stats()
        handle.remove()
    torch._dynamo.reset()
    assert 1 <= first <= 2 and counters["stats"]["unique_graphs"] == first
    assert stats.group_loads >= 3 * stats.groups
    assert all(torch.equal(o, ref) for o in outs)


@pytest.mark.parametrize("tier", ["pinned", "disk"])
@pytest.mark.parametrize("where", ["compute", "copy"])
def test_slow_streams_never_reuse_buffers_early(tmp_path, monkeypatch, tier, where):
    """Slow work queued on one stream: if any of the three waits were missing, a slot or a
    staging buffer would be overwritten while still in use and the output would differ."""
    model, x, ref = _ref("fp32")
    if where == "copy":
        real_copy = backend_mod.StreamBackend.copy

        def slow_copy(self, dst, src):
            torch.cuda._sleep(SLEEP_CYCLES)
            real_copy(self, dst, src)

        monkeypatch.setattr(backend_mod.StreamBackend, "copy", slow_copy)
    t = PinnedRamTier() if tier == "pinned" else DiskTier(str(tmp_path))
    handle = apply_offload(model, OffloadPolicy(tier=t, prefetch_depth=1), onload_device="cuda")
    hooks = []
    if where == "compute":
        for b in [*model.double_blocks, *model.single_blocks]:
            hooks.append(b.register_forward_hook(lambda m, a, o: torch.cuda._sleep(SLEEP_CYCLES)))
    with torch.no_grad():
        outs = [model(**x).clone() for _ in range(3)]
    torch.cuda.synchronize()
    for h in hooks:
        h.remove()
    handle.remove()
    assert all(torch.equal(o, ref) for o in outs)


def test_clean_under_cuda_sanitizer(tmp_path):
    code = f"""
import torch
from offload_core import apply_offload, OffloadPolicy, DiskTier, PinnedRamTier, BlockLevel
from tests.helpers import make_model
from offload_core.model.demo import demo_inputs
for tier in (PinnedRamTier(), DiskTier({str(tmp_path)!r})):
    m = make_model("fp32")
    x = demo_inputs(m, tokens=32, device="cuda")
    h = apply_offload(m, OffloadPolicy(tier=tier, prefetch_depth=2), onload_device="cuda")
    with torch.no_grad():
        for _ in range(3):
            m(**x)
    torch.cuda.synchronize()
    h.remove()
print("sanitizer-clean")
"""
    env = dict(os.environ, TORCH_CUDA_SANITIZER="1")
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0 and "sanitizer-clean" in r.stdout, r.stderr[-4000:]
