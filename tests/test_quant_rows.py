"""Quantizing a large Linear a slice of rows at a time is bit-identical to quantizing it whole
(it bounds torchao's temporaries, which reach 4-8x the layer, during the streaming load)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from offload_core.quant import PRESETS
from offload_core.quant import quantize as quantize_mod
from offload_core.quant.quantize import quantize_linear


def _configs() -> dict[str, Any]:
    from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerGroup, PerTensor

    out = {
        name: PRESETS[name].make_config()
        for name in ("int8-weight", "int8-dynamic", "float8-weight")
    }
    out["intx-int4-group32"] = IntxWeightOnlyConfig(
        weight_dtype=torch.int4, granularity=PerGroup(32)
    )
    # One scale for the whole tensor: not row by row, so it must be quantized whole.
    out["int8-per-tensor"] = Int8WeightOnlyConfig(granularity=PerTensor())
    return out


def _inner(t: torch.Tensor) -> tuple[list[str], Any, list[torch.Tensor]]:
    names, ctx = t.__tensor_flatten__()  # type: ignore[attr-defined]
    return names, ctx, [getattr(t, n) for n in names]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", list(_configs()))
def test_row_slices_equal_whole(
    name: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _configs()[name]
    slices: list[int] = []
    real_slice = quantize_mod._quantize_slice

    def counting(rows: torch.Tensor, cfg: Any) -> torch.Tensor:
        slices.append(rows.shape[0])
        return real_slice(rows, cfg)

    monkeypatch.setattr(quantize_mod, "_quantize_slice", counting)
    torch.manual_seed(0)
    whole = nn.Linear(256, 300, dtype=dtype)  # 300 rows: slices of 64 leave a ragged last one
    sliced = nn.Linear(256, 300, dtype=dtype)
    sliced.load_state_dict(whole.state_dict())
    quantize_linear(whole, config, chunk_bytes=1 << 40)  # one slice: torchao's own quantize_
    quantize_linear(sliced, config, chunk_bytes=64 * 256 * dtype.itemsize)
    # Row-by-row schemes went through 5 slices; the per-tensor one was probed once, then whole.
    assert slices == ([64] if name == "int8-per-tensor" else [64, 64, 64, 64, 44])
    assert type(sliced.weight) is type(whole.weight)
    assert isinstance(sliced.weight, nn.Parameter) and not sliced.weight.requires_grad
    names_w, ctx_w, parts_w = _inner(whole.weight)
    names_s, ctx_s, parts_s = _inner(sliced.weight)
    assert names_s == names_w and ctx_s == ctx_w
    for a, b in zip(parts_w, parts_s):
        assert a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
    x = torch.randn(5, 256, dtype=dtype)
    with torch.no_grad():
        assert torch.equal(sliced(x), whole(x))
