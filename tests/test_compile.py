"""Regional compilation with Ferry ([Note: compiling with Ferry] in
offload_core/model/regional_compile.py): each repeated block runs compiled while Ferry streams
its weights between blocks. The offloaded compiled output equals the resident compiled output
exactly (the same graphs run on the same bytes; only where the bytes sit differs), and dynamo's
own counters show one graph per kind of block, compiled once: never per group or per step."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

from offload_core import (
    BlockLevel,
    ConfigError,
    DiskTier,
    LeafLevel,
    OffloadPolicy,
    RamTier,
    apply_offload,
)
from offload_core.model.regional_compile import CompiledBlocks, CompileSettings, repeated_blocks
from tests.helpers import make_model

INDUCTOR = CompileSettings(backend="inductor")


def graphs() -> int:
    """Graphs dynamo has compiled since the last reset (its own counter)."""
    return int(counters["stats"]["unique_graphs"])


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def run(model: nn.Module, x: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model(**x)


def inputs(model: nn.Module) -> dict[str, torch.Tensor]:
    from offload_core.model.demo import demo_inputs

    return demo_inputs(model, tokens=16, seed=3)  # type: ignore[arg-type]


TIERS = {
    "ram": lambda p: RamTier(),
    "disk": lambda p: DiskTier(str(p), cpu_read="mapped"),
    "disk-copy": lambda p: DiskTier(str(p), cpu_read="copy"),
}


@pytest.mark.parametrize("blocks_per_group", [1, 2])
@pytest.mark.parametrize("tier", list(TIERS))
def test_compiled_offload_equals_compiled_resident_and_compiles_once(
    tmp_path, tier, blocks_per_group
):
    model = make_model("fp32")
    x = inputs(model)
    kinds = {type(b) for b in repeated_blocks(model)}
    assert len(kinds) == 2  # the demo DiT: double and single blocks
    compiled = CompiledBlocks(model, INDUCTOR)
    compiled.apply()
    # Compiled first under Ferry: the graphs are traced from blocks whose weights sit in the
    # slots (the ring on this CPU, or a mapped group file).
    policy = OffloadPolicy(level=BlockLevel(blocks_per_group), tier=TIERS[tier](tmp_path))
    handle = apply_offload(model, policy, onload_device="cpu")
    outs = [run(model, x)]
    first = graphs()
    outs += [run(model, x) for _ in range(3)]
    stats = handle.stats()
    handle.remove()
    assert 1 <= first <= len(kinds), f"{first} graphs for {len(kinds)} kinds of block"
    assert graphs() == first, "a later step recompiled"
    assert stats.forwards == 4 and stats.group_loads >= 4 * stats.groups  # Ferry streamed
    # The same compiled graphs without Ferry (the cache is reused: nothing recompiles).
    ref = run(model, x)
    assert graphs() == first
    for out in outs:
        assert torch.equal(out, ref)
    compiled.remove()
    eager = run(model, x)
    # Inductor's kernels differ from eager's in rounding (fused reductions, other matmul
    # paths), so the compiled output is not the eager one; it stays within fp32 noise.
    assert not any(b.__dict__.get("forward") for b in repeated_blocks(model))
    torch.testing.assert_close(ref, eager, rtol=1e-4, atol=1e-5)


def test_resident_compile_is_reused_when_ferry_streams(tmp_path):
    """Compiled resident first, then offloaded: Ferry's slot forms pass the same guards."""
    model = make_model("fp32")
    x = inputs(model)
    with CompiledBlocks(model, INDUCTOR):
        ref = run(model, x)
        first = graphs()
        handle = apply_offload(
            model, OffloadPolicy(level=BlockLevel(1), tier=RamTier()), onload_device="cpu"
        )
        outs = [run(model, x) for _ in range(2)]
        stats = handle.stats()
        handle.remove()
    assert stats.group_loads >= 2 * stats.groups
    assert graphs() == first <= 2
    assert all(torch.equal(o, ref) for o in outs)


def test_quantized_blocks_compile_once_and_stream_equal():
    """torchao int8 weights (wrapper subclasses Ferry swaps in place) under the same graphs."""
    model = make_model("bf16", "int8")
    x = inputs(model)
    with CompiledBlocks(model, INDUCTOR):
        handle = apply_offload(
            model, OffloadPolicy(level=BlockLevel(1), tier=RamTier()), onload_device="cpu"
        )
        outs = [run(model, x) for _ in range(3)]
        first = graphs()
        stats = handle.stats()
        handle.remove()
        ref = run(model, x)
    assert stats.group_loads >= 3 * stats.groups
    assert graphs() == first <= 2
    assert all(torch.equal(o, ref) for o in outs)


def test_a_whole_model_compiled_before_ferry_runs_without_its_hooks_and_ferry_says_so(caplog):
    """Why Ferry compiles blocks: dynamo does not guard on module hooks, so a whole model
    compiled before apply_offload keeps running its cached graph, and Ferry's hooks never run
    (the README says so; if torch starts guarding hooks this fails and the README changes)."""
    model = make_model("fp32")
    x = inputs(model)
    whole = torch.compile(model)
    ref = run(whole, x)
    handle = apply_offload(
        model, OffloadPolicy(level=BlockLevel(1), tier=RamTier()), onload_device="cpu"
    )
    with caplog.at_level("WARNING", logger="ferry"):
        out = run(whole, x)
    stats = handle.stats()
    handle.remove()
    assert torch.equal(out, ref) and stats.group_loads == 0
    assert "did not run in the traced forward" in caplog.text


def test_streamed_compile_refuses_what_cannot_work():
    INDUCTOR.check_streamed(BlockLevel(2))
    with pytest.raises(ConfigError, match="choose level block") as e:
        INDUCTOR.check_streamed(LeafLevel())
    assert e.value.setting == "level"
    for s in (CompileSettings(backend="cudagraphs"), CompileSettings(mode="reduce-overhead")):
        with pytest.raises(ConfigError, match="choose backend inductor") as e:
            s.check_streamed(BlockLevel(1))
        assert e.value.setting == "backend"


def test_settings_from_comfyui_kwargs():
    def keep(entries: list) -> list[bool]:
        return [True for _ in entries]

    kw = {"backend": "inductor", "options": {"guard_filter_fn": keep}, "mode": None,
          "fullgraph": False, "dynamic": None}  # fmt: skip
    s = CompileSettings.from_kwargs(kw)
    assert s.backend == "inductor" and s.options == {"guard_filter_fn": keep}
    # torch.compile pops guard_filter_fn out of the options it is given: ours stay whole.
    assert s.kwargs()["options"] is not s.options
    with pytest.raises(ConfigError, match=r"unknown torch\.compile argument"):
        CompileSettings.from_kwargs({"backend": "inductor", "cache": True})
    with pytest.raises(ConfigError, match="either a mode or options") as e:
        CompileSettings.from_kwargs({"mode": "max-autotune-no-cudagraphs", "options": {"a": 1}})
    assert e.value.setting == "mode"
    with pytest.raises(ConfigError, match="backend"):
        CompileSettings.from_kwargs({"backend": ""})


def test_a_model_without_repeated_blocks_is_refused_before_any_change():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    with pytest.raises(ConfigError, match="no list of repeated blocks"):
        CompiledBlocks(model, INDUCTOR)
    assert not any("forward" in m.__dict__ for m in model.modules())
