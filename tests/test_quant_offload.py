"""A quantized model through every offload tier: output exactly the resident quantized model's."""

from __future__ import annotations

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
from offload_core.model.demo import DemoDiT, build_demo_model, demo_inputs
from offload_core.quant import Preset, SkipRules, load_quantized, quantize_model

# IntxUnpackedToInt8Tensor cannot be pinned as a whole (its dispatch lacks aten.is_pinned,
# so .pin_memory() raises NotImplementedError): the pinned tier must pin its inner
# tensors. Not a user preset (its int4 values are stored unpacked in int8, so it saves nothing
# over int8-weight on CPU), but the offloader must carry it.
INTX = Preset(
    "intx-int4-test",
    "int4 values unpacked in int8, groups of 32",
    "IntxWeightOnlyConfig",
    ("cpu",),
    in_features_multiple=32,
    config_kwargs=lambda: {"weight_dtype": torch.int4, "granularity": _per_group(32)},
)
PRESETS: list[str | Preset] = ["int8-weight", "int8-dynamic", "float8-weight", INTX]
TENSOR = {
    "int8-weight": "Int8Tensor",
    "int8-dynamic": "Int8Tensor",
    "float8-weight": "Float8Tensor",
}


def _per_group(n: int):  # type: ignore[no-untyped-def]
    from torchao.quantization.granularity import PerGroup

    return PerGroup(n)


def _inner(t: torch.Tensor) -> list[torch.Tensor]:
    if hasattr(t, "__tensor_flatten__"):
        return [getattr(t, n) for n in t.__tensor_flatten__()[0]]
    return [t]


def _state_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        type(a[k]) is type(b[k])
        and all(torch.equal(x, y) for x, y in zip(_inner(a[k]), _inner(b[k])))
        for k in a
    )


@pytest.fixture(scope="module")
def models() -> dict[str, nn.Module]:
    """One small quantized demo model per preset (dim 64, 2+4 blocks, bf16)."""
    out = {}
    for preset in PRESETS:
        model = build_demo_model(size_gb=0.0015, dtype=torch.bfloat16, seed=0)
        report = quantize_model(model, preset, skip=SkipRules(min_weight_numel=0))
        assert len(report.quantized) >= 20, report.summary()
        out[preset if isinstance(preset, str) else preset.name] = model
    return out


LEVELS = {"block": BlockLevel(2), "leaf": LeafLevel()}


@pytest.mark.parametrize("tier_name", ["pinned", "ram", "disk"])
@pytest.mark.parametrize("level_name", ["block", "leaf"])
@pytest.mark.parametrize("preset", [p if isinstance(p, str) else p.name for p in PRESETS])
def test_offloaded_quantized_output_is_exactly_resident(
    models: dict[str, nn.Module], preset: str, level_name: str, tier_name: str, tmp_path: Path
) -> None:
    model = models[preset]
    kind = TENSOR.get(preset, "IntxUnpackedToInt8Tensor")
    assert type(model.double_blocks[0].img_mlp[0].weight).__name__ == kind
    x = demo_inputs(model, tokens=16)  # type: ignore[arg-type]
    with torch.no_grad():
        resident = model(**x)
    params = dict(model.named_parameters())
    state = {k: v for k, v in model.state_dict().items()}
    tier = {"pinned": PinnedRamTier(), "ram": RamTier(), "disk": DiskTier(str(tmp_path / "ferry"))}[
        tier_name
    ]
    handle = apply_offload(
        model, OffloadPolicy(level=LEVELS[level_name], tier=tier), onload_device="cpu", name=preset
    )
    try:
        with torch.no_grad():
            offloaded = model(**x)
            again = model(**x)
        stats = handle.stats()
    finally:
        handle.remove()
    assert torch.equal(offloaded, resident)
    assert torch.equal(again, resident)
    assert stats.groups > 1 and stats.group_loads > 0  # it really streamed groups
    if tier_name == "disk":
        assert stats.bytes_disk > 0
    # remove(): the same Parameter objects, holding the same bits, back where they were.
    assert all(p is params[n] for n, p in model.named_parameters())
    assert type(model.double_blocks[0].img_mlp[0].weight).__name__ == kind
    assert _state_equal(model.state_dict(), state)
    with torch.no_grad():
        assert torch.equal(model(**x), resident)


def test_cache_loaded_model_through_the_disk_tier(tmp_path: Path) -> None:
    """The whole path: checkpoint -> quantize-on-load -> cache -> warm load -> disk offload."""
    full = build_demo_model(size_gb=0.004, dtype=torch.bfloat16, seed=3)
    ckpt = tmp_path / "demo.safetensors"
    save_file(full.state_dict(), str(ckpt))
    dim, heads = full.dim, max(full.dim // 64, 1)
    shape = (dim, heads, len(full.double_blocks), len(full.single_blocks))

    def build(device: torch.device) -> nn.Module:
        return DemoDiT(*shape).to(torch.bfloat16).eval().requires_grad_(False)

    cold, r1 = load_quantized(ckpt, build, "int8-weight", cache_dir=tmp_path / "cache")
    warm, r2 = load_quantized(ckpt, build, "int8-weight", cache_dir=tmp_path / "cache")
    assert (r1.cache, r2.cache) == ("miss", "hit")
    x = demo_inputs(cold, tokens=16)  # type: ignore[arg-type]
    with torch.no_grad():
        resident = cold(**x)
    policy = OffloadPolicy(level=BlockLevel(1), tier=DiskTier(str(tmp_path / "d"), str(ckpt)))
    handle = apply_offload(warm, policy, onload_device="cpu")
    try:
        with torch.no_grad():
            assert torch.equal(warm(**x), resident)
    finally:
        handle.remove()
