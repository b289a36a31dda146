"""Tensor bytes are counted one way: the panel's model size is the bytes Ferry lays out,
torchao tensors by their inner tensors (int8 qdata + scale), not by the outer dtype."""

from __future__ import annotations

import importlib

import pytest
import torch

from offload_core import BlockLevel, LeafLevel
from offload_core.model.grouping import build_grouping
from offload_core.model.layout import tensor_nbytes
from tests.conftest import PACK_NAME, load_pack
from tests.helpers import make_model

pytest.importorskip("torchao")
load_pack()
context = importlib.import_module(f"{PACK_NAME}.web.panel.context")


def laid_out_bytes(model: torch.nn.Module, level: object) -> int:
    """What Ferry packs into the groups' slabs plus what it keeps resident (no padding)."""
    grouping = build_grouping(model, level)  # type: ignore[arg-type]
    return sum(g.tensor_bytes for g in grouping.groups) + grouping.resident_bytes


def test_int8_weight_only_tensor_is_its_qdata_and_scale() -> None:
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    linear = torch.nn.Linear(256, 128, bias=False)
    quantize_(linear, Int8WeightOnlyConfig())
    w = linear.weight
    names, _ = w.__tensor_flatten__()
    inner = [getattr(w, n) for n in names]
    assert any(t.dtype == torch.int8 for t in inner), names
    assert tensor_nbytes(w) == sum(t.numel() * t.element_size() for t in inner)
    assert tensor_nbytes(w) < w.numel() * w.element_size(), "int8 is smaller than fp32"


@pytest.mark.parametrize("level", [LeafLevel(), BlockLevel(2)], ids=["leaf", "block"])
def test_panel_model_size_is_the_bytes_ferry_lays_out(level: object) -> None:
    model = make_model("fp32", "int8")  # the blocks' Linears are Int8WeightOnly-quantized
    assert any(hasattr(p, "__tensor_flatten__") for p in model.parameters())
    panel_size = context.model_bytes(model)
    assert panel_size == laid_out_bytes(model, level)
    outer = sum(t.numel() * t.element_size() for t in model.parameters())
    assert panel_size < outer, "the outer element size overcounts a quantized model"
