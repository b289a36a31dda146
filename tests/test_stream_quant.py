"""load_offloaded(quantize=...) (issue 11): torchao presets group by group into the tiers.

The output equals the checkpoint read whole and quantized by torchao's ``quantize_``;
on the disk tier each group holding a quantized weight is written to Ferry's group file and
the others keep reading the checkpoint; a baked change (a LoRA) is applied before quantizing;
a bad preset or skip list is refused before any weight moves.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from offload_core import BlockLevel, ConfigError, DiskTier, LeafLevel, OffloadPolicy, RamTier
from offload_core.loader import load_offloaded
from offload_core.model.demo import DemoDiT, build_demo_model, demo_inputs
from offload_core.quant.selection import is_quantized
from tests.helpers import torchao_quantize

pytest.importorskip("torchao")

PREFIX = "model.diffusion_model."


@pytest.fixture(scope="module")
def stored() -> DemoDiT:
    return build_demo_model(0.01, dtype=torch.bfloat16)


def _builder(m: DemoDiT, dtype: torch.dtype = torch.bfloat16):  # type: ignore[no-untyped-def]
    dim, nd, ns = m.dim, len(m.double_blocks), len(m.single_blocks)
    return lambda dev: (
        DemoDiT(dim, max(dim // 64, 1), nd, ns).to(dtype).eval().requires_grad_(False)
    )


def _save(model: nn.Module, path: Path) -> Path:
    save_file({PREFIX + k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def _run(model: nn.Module, ref: nn.Module) -> torch.Tensor:
    inputs = {k: v.to(torch.bfloat16) for k, v in demo_inputs(ref, tokens=16).items()}
    with torch.no_grad():
        return model(**inputs)  # type: ignore[no-any-return]


def _resident(path: Path, stored: DemoDiT, preset: str) -> nn.Module:
    """The reference: the checkpoint read whole into the model, quantized by torchao's own
    ``quantize_`` (tests/helpers.py: torchao_quantize)."""
    from safetensors.torch import load_file

    model = _builder(stored)(torch.device("cpu"))
    model.load_state_dict({k.removeprefix(PREFIX): v for k, v in load_file(str(path)).items()})
    torchao_quantize(model, preset)
    return model


CASES = [
    ("int8-weight", "disk", BlockLevel(2)),
    ("int8-weight", "ram", BlockLevel(2)),
    ("float8-weight", "disk", BlockLevel(1)),
    ("int8-dynamic", "disk", LeafLevel()),
]


@pytest.mark.parametrize(
    ("preset", "tier", "level"), CASES, ids=[f"{p}-{t}-{type(lv).__name__}" for p, t, lv in CASES]
)
def test_equal_to_torchao_on_the_whole_model(stored, preset, tier, level, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = _save(stored, tmp_path / "m.safetensors")
    ref = _resident(path, stored, preset)
    expected = _run(ref, ref)
    folder = tmp_path / "ferry"
    policy = OffloadPolicy(level=level, tier=DiskTier(str(folder)) if tier == "disk" else RamTier())
    handle = load_offloaded(
        path, _builder(stored), policy, onload_device="cpu", prefix=PREFIX, quantize=preset
    )
    model = handle.model
    report = handle.quant_report
    assert report is not None and report.preset == preset and report.quantized
    assert report.bytes_after < report.bytes_before
    # Every weight torchao quantized resident is quantized here too, with the same bytes.
    qref = {n for n, p in ref.named_parameters() if is_quantized(p)}
    assert {r.name + ".weight" for r in report.quantized} == qref
    assert torch.equal(_run(model, ref), expected)
    assert torch.equal(_run(model, ref), expected)  # the second pass reads the tier again
    store = handle._placement.store
    if store is not None:
        quantized = {r.name + ".weight" for r in report.quantized}
        holding = {
            f"group-{g.index:05d}.safetensors"
            for g, gp in zip(handle.plan.grouping.groups, handle.plan.groups)
            if not gp.resident and any(e.qualname in quantized for e in g.entries)
        }
        # Only groups holding a quantized weight are written; the rest read the checkpoint.
        assert holding and {w.name for w in store.written} == holding
    handle.remove()
    assert {t.device.type for t in [*model.parameters(), *model.buffers()]} == {"meta"}


def test_a_baked_change_is_applied_before_quantizing(stored, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = _save(stored, tmp_path / "m.safetensors")
    name = "double_blocks.0.img_mlp.0.weight"
    patched = copy.deepcopy(stored)
    with torch.no_grad():
        dict(patched.named_parameters())[name].mul_(2)
    ref = _resident(_save(patched, tmp_path / "p.safetensors"), stored, "int8-weight")
    handle = load_offloaded(
        path,
        _builder(stored),
        OffloadPolicy(level=BlockLevel(1), tier=DiskTier(str(tmp_path / "ferry"))),
        onload_device="cpu",
        prefix=PREFIX,
        convert=lambda n, t: t * 2,
        converts={name}.__contains__,
        quantize="int8-weight",
    )
    assert is_quantized(dict(handle.model.named_parameters())[name])
    assert torch.equal(_run(handle.model, ref), _run(ref, ref))
    handle.remove()


@pytest.mark.parametrize(
    ("kw", "setting"),
    [
        ({"quantize": "int9"}, "quant_preset"),
        ({"quantize": "int8-weight", "skip": [""]}, "quant_skip"),
    ],
)
def test_bad_settings_are_refused_before_anything_moves(stored, kw, setting, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = _save(stored, tmp_path / "m.safetensors")
    folder = tmp_path / "ferry"
    with pytest.raises(ConfigError) as err:
        load_offloaded(
            path,
            _builder(stored),
            OffloadPolicy(level=BlockLevel(1), tier=DiskTier(str(folder))),
            prefix=PREFIX,
            **kw,
        )
    assert err.value.setting == setting
    assert not folder.exists() or not any(folder.iterdir())


def test_a_plain_load_quantizes_the_whole_model_the_same_way(stored, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # The Ferry loader's model read whole (no Ferry Offload Model after it): materialize.
    from offload_core.quant.group_stream import plan_quantized
    from offload_core.sources.checkpoint_stream import CheckpointWeights

    path = _save(stored, tmp_path / "m.safetensors")
    ref = _resident(path, stored, "int8-weight")
    with torch.device("meta"):
        model = _builder(stored)(torch.device("meta"))
    quant = plan_quantized(model, "int8-weight")
    convert, changed = quant.after(None, None)
    weights = CheckpointWeights.open(path, model, prefix=PREFIX, convert=convert, changed=changed)
    weights.materialize(model, "cpu")
    assert {n for n, p in model.named_parameters() if is_quantized(p)} == quant.names
    assert all(t.device.type == "cpu" for t in [*model.parameters(), *model.buffers()])
    assert torch.equal(_run(model, ref), _run(ref, ref))
