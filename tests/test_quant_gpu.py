"""GPU presets and quantized offload with real streams (skipped without CUDA)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
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
from offload_core.errors import ConfigError
from offload_core.model.demo import DemoDiT, build_demo_model, demo_inputs
from offload_core.quant import PRESETS, load_quantized, presets_for_device, quantize_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _can_run(preset: str) -> bool:
    return PRESETS[preset].unsupported_reason("cuda") is None


def test_gpu_preset_list_matches_the_hardware() -> None:
    names = presets_for_device("cuda")
    assert names[:4] == ["none", "int8-weight", "int8-dynamic", "float8-weight"]
    assert ("int4-weight" in names) == (importlib.util.find_spec("mslk") is not None)
    assert ("float8-dynamic" in names) == (torch.cuda.get_device_capability() >= (8, 9))
    for name in set(PRESETS) - set(names):
        with pytest.raises(ConfigError) as info:
            quantize_model(nn.Linear(256, 256).cuda(), name)
        assert info.value.setting == "quant_preset" and "int8-weight" in str(info.value)


PRESETS_ON_GPU = ["int8-weight", "int8-dynamic", "float8-weight", "int4-weight", "float8-dynamic"]


@pytest.mark.parametrize("tier_name", ["pinned", "ram", "disk"])
@pytest.mark.parametrize("level", [BlockLevel(2), LeafLevel()], ids=["block", "leaf"])
@pytest.mark.parametrize("preset", PRESETS_ON_GPU)
def test_offloaded_quantized_output_is_exactly_resident_on_gpu(
    preset: str, level: BlockLevel | LeafLevel, tier_name: str, tmp_path: Path
) -> None:
    if not _can_run(preset):
        pytest.skip(PRESETS[preset].unsupported_reason("cuda") or "")
    # dim 128 (23 + 46 blocks): int4's group of 128 and float8's multiple of 16 divide every
    # block Linear's in_features (128, 512, 640).
    model = build_demo_model(size_gb=0.05, dtype=torch.bfloat16, seed=0)
    report = quantize_model(model, preset, device="cuda")
    assert report.quantized
    x = demo_inputs(model, tokens=64, device="cuda")
    with torch.no_grad():
        resident = model(**x)
    params = dict(model.named_parameters())
    model.cpu()  # offload from host RAM, as a model too large for the GPU would be
    tier = {"pinned": PinnedRamTier(), "ram": RamTier(), "disk": DiskTier(str(tmp_path / "d"))}[
        tier_name
    ]
    handle = apply_offload(
        model, OffloadPolicy(level=level, tier=tier, prefetch_depth=2), onload_device="cuda"
    )
    try:
        with torch.no_grad():
            outs = [model(**x) for _ in range(3)]
        torch.cuda.synchronize()
    finally:
        handle.remove()
    for out in outs:
        assert torch.equal(out, resident)
    assert all(p is params[n] for n, p in model.named_parameters())


def test_load_quantized_on_gpu_with_cache(tmp_path: Path) -> None:
    full = build_demo_model(size_gb=0.05, dtype=torch.bfloat16, seed=1)
    ckpt = tmp_path / "m.safetensors"
    save_file(full.state_dict(), str(ckpt))
    shape = (full.dim, max(full.dim // 64, 1), len(full.double_blocks), len(full.single_blocks))

    def build(device: torch.device) -> nn.Module:
        return DemoDiT(*shape).to(torch.bfloat16).eval().requires_grad_(False)

    for preset in [p for p in PRESETS_ON_GPU if _can_run(p)]:
        cold, r1 = load_quantized(ckpt, build, preset, cache_dir=tmp_path / "c", device="cuda")
        warm, r2 = load_quantized(ckpt, build, preset, cache_dir=tmp_path / "c", device="cuda")
        assert (r1.cache, r2.cache) == ("miss", "hit"), preset
        assert all(p.device.type == "cuda" for p in warm.parameters())
        x = demo_inputs(cold, tokens=64, device="cuda")
        with torch.no_grad():
            assert torch.equal(cold(**x), warm(**x)), preset


def test_quantize_on_gpu_for_a_model_kept_in_ram(tmp_path: Path) -> None:
    """quantize_device="cuda", device="cpu": GPU-only presets for a model the offloader streams."""
    full = build_demo_model(size_gb=0.05, dtype=torch.bfloat16, seed=2)
    ckpt = tmp_path / "m.safetensors"
    save_file(full.state_dict(), str(ckpt))
    shape = (full.dim, max(full.dim // 64, 1), len(full.double_blocks), len(full.single_blocks))

    def build(device: torch.device) -> nn.Module:
        return DemoDiT(*shape).to(torch.bfloat16).eval().requires_grad_(False)

    for preset in [p for p in PRESETS_ON_GPU if _can_run(p)]:
        on_gpu, _ = load_quantized(ckpt, build, preset, device="cuda")
        in_ram, report = load_quantized(ckpt, build, preset, device="cpu", quantize_device="cuda")
        assert report.quantized, preset
        assert all(p.device.type == "cpu" for p in in_ram.parameters()), preset
        x = demo_inputs(on_gpu, tokens=64, device="cuda")
        handle = apply_offload(in_ram, OffloadPolicy(level=BlockLevel(1)), onload_device="cuda")
        try:
            with torch.no_grad():
                assert torch.equal(in_ram(**x), on_gpu(**x)), preset
        finally:
            handle.remove()
