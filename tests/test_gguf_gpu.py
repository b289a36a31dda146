"""GGUF weights (ComfyUI-GGUF's GGMLTensor, stood in by tests/gguf_standin.py) streamed to a
real GPU: every tier and level, output equal to the same model resident on the GPU, and every
weight the same object with the same attributes during the offload and after remove().
Skipped without CUDA; `bash tools/gpu_suite.sh` runs it on a lent GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from offload_core import (
    BlockLevel,
    DiskTier,
    LeafLevel,
    OffloadPolicy,
    PinnedRamTier,
    RamTier,
    apply_offload,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]
gguf_standin = pytest.importorskip("tests.gguf_standin")


def resident_on_cuda(path: Path) -> nn.Module:
    """The same file loaded, each GGML tensor moved to the GPU by its own ``.to`` (which keeps
    its attributes, as the pack's does): the reference the offloaded run must equal."""
    model = gguf_standin.gguf_model(path)
    for name, p in list(model.named_parameters()):
        owner, attr = name.rsplit(".", 1)
        setattr(model.get_submodule(owner), attr, nn.Parameter(p.to("cuda"), requires_grad=False))
    return model


@pytest.mark.parametrize("mix", ["q8_0", "k"])
@pytest.mark.parametrize("tier", ["pinned", "ram", "disk"])
@pytest.mark.parametrize("level", ["block", "leaf"])
def test_gguf_streamed_to_cuda_equals_resident(tmp_path: Path, mix: str, tier: str, level: str):
    path = gguf_standin.write_gguf(tmp_path / f"net-{mix}.gguf", mix)
    x = torch.randn(3, gguf_standin.WIDTH, generator=torch.Generator().manual_seed(1)).cuda()
    with torch.no_grad():
        ref = resident_on_cuda(path)(x)
    model = gguf_standin.gguf_model(path)
    seen = gguf_standin.attributes(model)
    folder = tmp_path / "ferry"
    folder.mkdir()
    tiers = {"pinned": PinnedRamTier(), "ram": RamTier(), "disk": DiskTier(str(folder))}
    lv = BlockLevel(1) if level == "block" else LeafLevel()
    policy = OffloadPolicy(level=lv, tier=tiers[tier], prefetch_depth=2)
    handle = apply_offload(model, policy, onload_device="cuda")
    with torch.no_grad():
        outs = [model(x).clone() for _ in range(3)]
    torch.cuda.synchronize()
    during = gguf_standin.attributes(model)
    stats = handle.stats()
    handle.remove()
    assert all(o.device.type == "cuda" and torch.equal(o, ref) for o in outs)
    assert stats.bytes_h2d + stats.bytes_disk > 0, "Ferry moved the weights"
    assert during == seen and gguf_standin.attributes(model) == seen
    assert all(p.device.type == "cpu" for p in model.parameters()), "remove() puts them back"
    assert not any(folder.iterdir()), "remove() deletes what Ferry wrote"
