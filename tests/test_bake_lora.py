"""``bake_lora``'s choice (offload_core/model/bake.py: [Note: baking a patched weight]) on
fake targets; the exactness against ComfyUI-GGUF is bench/gguf_lora_paired.py's and the real
ComfyUI suite's (tests/comfyui/test_comfyui_gguf.py)."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from offload_core import ConfigError, OffloadPolicy
from offload_core.model.bake import BakeTarget, bake_patched
from offload_core.policy import parse_bake_lora
from tests.gguf_standin import GGMLStandin, weight_now


def _targets(n: int, cost_s: float, out_numel: int = 1024) -> list[BakeTarget]:
    def compute() -> torch.Tensor:
        time.sleep(cost_s)
        return torch.ones(out_numel)

    return [BakeTarget(f"k{i}", nn.Linear(1, 1), "weight", 1000, compute) for i in range(n)]


def test_off_keeps_todays_behaviour() -> None:
    kept: list[str] = []
    choice = bake_patched(_targets(3, 0), "off", lambda: 1.0, lambda t, w: kept.append(t.key))
    assert not choice.bake and kept == []
    assert "patched on every forward" in choice.describe()


def test_on_bakes_every_target_once() -> None:
    kept: list[str] = []
    asked: list[int] = []

    def speed() -> float:
        asked.append(1)
        return 1.0

    choice = bake_patched(_targets(9, 0), "on", speed, lambda t, w: kept.append(t.key))
    assert choice.bake and kept == [f"k{i}" for i in range(9)]
    assert choice.baked_bytes == 9 * 4096 and asked == []  # "on" measures nothing
    assert "baked once" in choice.describe()


@pytest.mark.parametrize("gbps,bakes", [(1000.0, True), (1e-9, False)])
def test_auto_weighs_patch_time_against_the_extra_bytes(gbps: float, bakes: bool) -> None:
    kept: list[str] = []
    choice = bake_patched(
        _targets(10, 0.002), "auto", lambda: gbps, lambda t, w: kept.append(t.key)
    )
    assert choice.bake is bakes
    assert len(kept) == (10 if bakes else 0)
    assert choice.patch_s is not None and choice.patch_s >= 10 * 0.002 * 0.9
    line = choice.describe()
    assert "bake_lora auto" in line and "measured" in line and f"{gbps:.1f} GB/s" in line


def test_the_setting_parses_and_round_trips() -> None:
    assert parse_bake_lora(" Auto ") == "auto" and parse_bake_lora(True) == "on"
    with pytest.raises(ConfigError, match="bake_lora"):
        parse_bake_lora("sometimes")
    with pytest.raises(ConfigError, match="bake_lora"):
        OffloadPolicy(bake_lora="yes").validate()  # type: ignore[arg-type]
    p = OffloadPolicy(bake_lora="auto")
    assert OffloadPolicy.from_dict(p.to_dict()) == p
    assert OffloadPolicy.from_dict({**p.to_dict(), "bake_lora": None}).bake_lora == "off"


def test_a_baked_standin_weight_computes_as_its_per_forward_path() -> None:
    """The shape of the host's bake: the layer's own per-forward function, run once, gives
    the plain weight the layer then uses as it is (here with the CI stand-in's GGML layer)."""
    import gguf
    import numpy as np

    q8 = gguf.GGMLQuantizationType.Q8_0
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    raw = torch.from_numpy(gguf.quants.quantize(w, q8))
    delta = torch.randn(64, 64) * 0.01
    t = GGMLStandin(raw, tensor_type=q8, tensor_shape=torch.Size((64, 64)), patches=[(delta, 0.7)])
    per_forward = weight_now(t, torch.float32)
    kept: dict[str, torch.Tensor] = {}
    target = BakeTarget(
        "w", nn.Linear(1, 1), "weight", raw.numel(), lambda: weight_now(t, torch.float32)
    )  # type: ignore[arg-type, return-value]
    bake_patched([target], "on", lambda: 1.0, lambda tg, baked: kept.update(w=baked))
    assert per_forward is not None and torch.equal(kept["w"], per_forward)


def test_a_baked_weight_is_counted_by_its_storage() -> None:
    # One size rule (model/layout.py tensor_nbytes): a torchao weight by its inner tensors
    # (int8 qdata + fp32 scales), never by its outer dtype's numel * element_size.
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    lin = nn.Linear(256, 256, bias=False)
    quantize_(lin, Int8WeightOnlyConfig())
    w = lin.weight.detach()
    target = BakeTarget("k", nn.Linear(1, 1), "weight", 1000, lambda: w)
    choice = bake_patched([target], "on", lambda: 1.0, lambda t, baked: None)
    assert choice.baked_bytes < w.numel() * w.element_size()
    assert choice.baked_bytes >= 256 * 256  # the int8 qdata
