"""What gets quantized: the default skip list, user patterns, and the per-layer report."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from offload_core.errors import ConfigError
from offload_core.quant import Preset, SkipRules, quantize_model


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(256)
        self.ada_norm = nn.Linear(256, 512)  # an adaLN-style Linear: named "norm", so kept
        self.attn = nn.Linear(256, 768)
        self.mlp = nn.Linear(256, 1024)
        self.tiny = nn.Linear(256, 16)  # 4096 weights: too small to gain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        return x + self.attn(h)[..., :256] + self.mlp(h)[..., :256] + self.ada_norm(h)[..., :256]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 256)
        self.proj_in = nn.Linear(256, 256)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.proj_out = nn.Linear(256, 256)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.proj_in(self.embed(ids))
        for b in self.blocks:
            x = b(x)
        return self.proj_out(x)


def _net() -> Net:
    torch.manual_seed(0)
    return Net().eval().requires_grad_(False)


def _reasons(report) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {r.name: ("quantized" if r.quantized else r.reason) for r in report.layers}


def test_defaults_quantize_block_linears_and_say_why_others_are_kept() -> None:
    model = _net()
    original = {k: v.clone() for k, v in model.state_dict().items()}
    report = quantize_model(model, "int8-weight")
    reasons = _reasons(report)
    assert reasons["embed"] == "not a Linear (Embedding)"
    assert reasons["proj_in"] == "outside the blocks"
    assert reasons["proj_out"] == "outside the blocks"
    for i in (0, 1):
        assert reasons[f"blocks.{i}.norm1"] == "not a Linear (LayerNorm)"
        assert reasons[f"blocks.{i}.ada_norm"] == "matches skip pattern '*norm*'"
        assert reasons[f"blocks.{i}.tiny"] == "too small (4096 weights < 16384)"
        assert reasons[f"blocks.{i}.attn"] == "quantized"
        assert reasons[f"blocks.{i}.mlp"] == "quantized"
    # What the report says is what happened to the weights.
    for r in report.layers:
        module = model.get_submodule(r.name)
        weight = module.weight
        assert (type(weight).__name__ == "Int8Tensor") == r.quantized, r.name
        if not r.quantized:
            assert type(weight) is nn.Parameter and torch.equal(
                weight, original[f"{r.name}.weight"]
            )


def test_report_counts_bytes_exactly() -> None:
    model = _net()
    report = quantize_model(model, "int8-weight")
    mlp = next(r for r in report.layers if r.name == "blocks.0.mlp")
    # fp32 1024x256 weight + 1024 bias -> int8 qdata + fp32 scale + int8 zero point per row.
    assert mlp.bytes_before == 1024 * 256 * 4 + 1024 * 4
    assert mlp.bytes_after == 1024 * 256 + 1024 * 4 + 1024 + 1024 * 4
    kept = next(r for r in report.layers if r.name == "proj_in")
    assert kept.bytes_before == kept.bytes_after == 256 * 256 * 4 + 256 * 4
    assert report.bytes_before == sum(p.numel() * 4 for p in _net().parameters())
    assert report.bytes_after < report.bytes_before
    assert "blocks.0.mlp" in report.describe() and "quantized" in report.describe()


def test_user_patterns_add_skips_and_force_quantization() -> None:
    model = _net()
    report = quantize_model(model, "int8-weight", skip=["blocks.1.*", "!proj_out", "!*tiny"])
    reasons = _reasons(report)
    assert reasons["blocks.1.mlp"] == "matches skip pattern 'blocks.1.*'"
    assert reasons["blocks.0.mlp"] == "quantized"
    assert reasons["proj_out"] == "quantized"  # forced past "outside the blocks"
    assert reasons["blocks.0.tiny"] == "quantized"  # forced past the size rule
    assert reasons["proj_in"] == "outside the blocks"
    # A comma-separated string (the nodes' text field) means the same.
    assert SkipRules.from_user("blocks.1.*, !proj_out,!*tiny") == SkipRules.from_user(
        ["blocks.1.*", "!proj_out", "!*tiny"]
    )


def test_rules_object_replaces_the_defaults() -> None:
    model = _net()
    report = quantize_model(model, "float8-weight", skip=SkipRules(patterns=(), min_weight_numel=0))
    reasons = _reasons(report)
    assert reasons["blocks.0.ada_norm"] == "quantized"
    assert reasons["blocks.0.tiny"] == "quantized"
    assert reasons["proj_in"] == "outside the blocks"
    everything = quantize_model(
        _net(), "int8-weight", skip=SkipRules(patterns=(), blocks_only=False, min_weight_numel=0)
    )
    assert sum(r.quantized for r in everything.layers) == 10  # every Linear: 2 + 2 blocks x 4


def test_model_without_block_lists_keeps_first_and_last_projection() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 256), nn.Linear(256, 256))
    reasons = _reasons(quantize_model(model, "int8-weight"))
    assert reasons == {"0": "first projection", "2": "quantized", "3": "last projection"}


def test_kernel_shape_rule_and_already_quantized() -> None:
    odd = Preset(
        "int8-test", "int8 for tests", "Int8WeightOnlyConfig", ("cpu",), in_features_multiple=32
    )
    model = nn.Sequential(nn.ModuleList([nn.Linear(200, 256), nn.Linear(256, 256)]))
    reasons = _reasons(quantize_model(model, odd))
    assert reasons["0.0"] == "in_features 200 is not a multiple of 32"
    assert reasons["0.1"] == "quantized"
    again = _reasons(quantize_model(model, "int8-weight"))
    assert again["0.1"] == "already quantized (Int8Tensor)"


@pytest.mark.parametrize("bad", [[""], ["!"], [3], SkipRules(min_weight_numel=-1)])
def test_bad_skip_list_names_the_setting(bad: object) -> None:
    model = _net()
    with pytest.raises(ConfigError) as info:
        quantize_model(model, "int8-weight", skip=bad)  # type: ignore[arg-type]
    assert info.value.setting == "quant_skip"
    assert all(type(p) is nn.Parameter for p in model.parameters())  # nothing was touched


def test_tied_weight_is_left_alone() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(256, 256), nn.ModuleList([nn.Linear(256, 256), nn.Linear(256, 256)])
    )
    model[1][1].weight = model[1][0].weight  # two layers, one weight
    reasons = _reasons(quantize_model(model, "int8-weight"))
    assert reasons["1.0"] == reasons["1.1"] == "weight shared with another layer"
    assert model[1][0].weight is model[1][1].weight and type(model[1][0].weight) is nn.Parameter
