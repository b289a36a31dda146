"""GGUF weights (ComfyUI-GGUF's GGMLTensor, stood in by tests/gguf_standin.py) through Ferry:
real .gguf files written by the ``gguf`` package, every tier and level, output equal to the
resident model and every weight the same object of the same class with the same attributes,
during the offload and after remove(). A tensor Ferry cannot move faithfully is refused by name
before anything moves."""

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
    UnsupportedTensorError,
    apply_offload,
    plan_offload,
)
from offload_core.model.layout import tensor_nbytes
from tests.gguf_standin import (
    WIDTH,
    GGMLStandin,
    attributes,
    gguf_model,
    raw_bytes,
    write_gguf,
)

LEVELS = {"block1": BlockLevel(1), "block2": BlockLevel(2), "leaf": LeafLevel()}


def tiers(folder: Path) -> dict[str, object]:
    return {
        "pinned": PinnedRamTier(),
        "ram": RamTier(),
        "disk": DiskTier(str(folder), cpu_read="mapped"),
        "disk-copy": DiskTier(str(folder), cpu_read="copy"),
    }


@pytest.fixture(scope="module", params=["q8_0", "k"])
def gguf_file(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(tmp_path_factory.mktemp("gguf") / f"net-{request.param}.gguf", request.param)


X = torch.randn(3, WIDTH, generator=torch.Generator().manual_seed(1))


def raw_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: raw_bytes(p).clone() for k, p in model.named_parameters()}


def test_the_file_holds_quantized_bytes(gguf_file: Path) -> None:
    """The premise: a weight's bytes are not its shape's (so a layout by ``.shape`` fails)."""
    model = gguf_model(gguf_file)
    w = model.blocks[0].a.weight
    assert isinstance(w, GGMLStandin) and isinstance(w, nn.Parameter)
    assert w.shape == (WIDTH, WIDTH) and w.size() != w.shape
    assert tensor_nbytes(w) == raw_bytes(w).numel() < WIDTH * WIDTH * 2


@pytest.mark.parametrize("tier", ["pinned", "ram", "disk", "disk-copy"])
@pytest.mark.parametrize("level", ["block1", "block2", "leaf"])
def test_gguf_offloaded_equals_resident(gguf_file: Path, tmp_path: Path, level: str, tier: str):
    model = gguf_model(gguf_file)
    with torch.no_grad():
        ref = model(X)
    before, seen = raw_state(model), attributes(model)
    folder = tmp_path / "ferry"
    folder.mkdir()
    policy = OffloadPolicy(level=LEVELS[level], tier=tiers(folder)[tier], prefetch_depth=2)
    handle = apply_offload(model, policy, onload_device="cpu")
    with torch.no_grad():
        outs = [model(X) for _ in range(3)]
    during = attributes(model)
    stats = handle.stats()
    handle.remove()
    assert all(torch.equal(o, ref) for o in outs)
    assert stats.bytes_h2d + stats.bytes_disk > 0, "Ferry moved the weights"
    assert during == seen, "a layer sees the same GGML tensor objects while Ferry streams"
    assert attributes(model) == seen, "and after remove()"
    after = raw_state(model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not any(folder.iterdir()), "remove() deletes what Ferry wrote"


@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_patches_on_a_gguf_weight_are_kept_and_applied(gguf_file: Path, tmp_path: Path, tier):
    """ComfyUI-GGUF applies LoRA per forward from the weight's ``patches``: they travel with
    the weight object through Ferry's layout, set before it or while it is live."""
    model = gguf_model(gguf_file)
    gen = torch.Generator().manual_seed(5)
    before_delta = torch.randn(WIDTH, WIDTH, generator=gen) * 0.01
    live_delta = torch.randn(WIDTH, WIDTH, generator=gen) * 0.01
    model.blocks[1].a.weight.patches = [(before_delta, 0.7)]
    with torch.no_grad():
        ref_before = model(X)
        model.blocks[2].b.weight.patches = [(live_delta, 1.3)]
        ref_both = model(X)
        model.blocks[2].b.weight.patches = []
    handle = apply_offload(
        model, OffloadPolicy(level=BlockLevel(1), tier=tiers(tmp_path)[tier]), onload_device="cpu"
    )
    with torch.no_grad():
        out_before = model(X)
        model.blocks[2].b.weight.patches = [(live_delta, 1.3)]  # as GGUF's patcher does
        out_both = model(X)
    handle.remove()
    assert torch.equal(out_before, ref_before) and torch.equal(out_both, ref_both)
    assert model.blocks[1].a.weight.patches[0][0] is before_delta


class _OwnDispatch(torch.Tensor):
    """A subclass that decides what its storage means itself (no __tensor_flatten__)."""

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[override]
        return func(*args, **(kwargs or {}))


class _SelfView(torch.Tensor):
    """A plain subclass that keeps a view of its own bytes in an attribute."""


def _refusable(kind: str) -> torch.Tensor:
    base = torch.randn(WIDTH, WIDTH)
    if kind == "own-dispatch":
        return base.as_subclass(_OwnDispatch)
    if kind == "self-view":
        t = base.as_subclass(_SelfView)
        t.cache = base[:4]
        return t
    if kind == "sparse":
        return base.to_sparse()
    return torch.quantize_per_tensor(base, 0.1, 0, torch.qint8)


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
@pytest.mark.parametrize("kind", ["own-dispatch", "self-view", "sparse", "torch-quantized"])
def test_a_tensor_ferry_cannot_move_is_refused_by_name(tmp_path: Path, kind: str) -> None:
    model = gguf_model(write_gguf(tmp_path / "net.gguf", "q8_0"))
    bad = _refusable(kind)
    before = raw_state(model)
    model.blocks[2].b._parameters["weight"] = bad  # as a loader would set it, no op on it
    seen = attributes(model)
    folder = tmp_path / "ferry"
    folder.mkdir()
    policy = OffloadPolicy(level=BlockLevel(1), tier=DiskTier(str(folder)))
    with pytest.raises(UnsupportedTensorError, match=r"blocks\.2\.b\.weight: .* cannot offload"):
        plan_offload(model, policy, onload_device="cpu")
    with pytest.raises(UnsupportedTensorError, match=type(bad).__name__):
        apply_offload(model, policy, onload_device="cpu")
    assert attributes(model) == seen, "nothing moved"
    assert model.blocks[2].b._parameters["weight"] is bad
    del model.blocks[2].b._parameters["weight"]
    assert all(torch.equal(raw_bytes(p), before[k]) for k, p in model.named_parameters())
    assert not any(folder.iterdir()), "nothing written"
