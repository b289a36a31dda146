"""[Note: a pass the host marks]: a model whose root is never called (a text encoder: ComfyUI
calls each encoder of a CLIP, never the CLIP model) is traced, predicted and counted when the
host marks its passes, with outputs equal to the resident model's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from offload_core import BlockLevel, DiskTier, OffloadPolicy, PinnedRamTier, apply_offload


class Layer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.proj(x))


class Encoder(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.embed = nn.Linear(width, width)
        self.layers = nn.ModuleList(Layer(width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return x


class PairOfEncoders(nn.Module):
    """As SD3's or Flux's CLIP: two encoders, called one after the other by the host."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.small = Encoder(32, 3)
        self.large = Encoder(64, 5)

    def forward(self, *args: object) -> None:
        raise AssertionError("the host never calls the model around the encoders")

    def encode(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.small(a), self.large(b)


A, B = torch.randn(2, 32), torch.randn(2, 64)


def _offloaded(tmp_path: Path, tier: str) -> tuple[PairOfEncoders, object, tuple]:
    model = PairOfEncoders().eval()
    with torch.no_grad():
        ref = model.encode(A, B)
    t = PinnedRamTier() if tier == "pinned" else DiskTier(str(tmp_path))
    policy = OffloadPolicy(level=BlockLevel(1), tier=t, prefetch_depth=2)
    return model, apply_offload(model, policy, onload_device="cpu"), ref


@pytest.mark.parametrize("tier", ["pinned", "disk"])
def test_marked_passes_are_traced_predicted_and_counted(tmp_path: Path, tier: str) -> None:
    model, handle, ref = _offloaded(tmp_path, tier)
    outs = []
    with torch.no_grad():
        for _ in range(4):
            with handle.one_pass():
                outs.append(model.encode(A, B))
    first_loads = handle.stats()
    with torch.no_grad(), handle.one_pass(), handle.one_pass():  # nested: one pass
        outs.append(model.encode(A, B))
    stats = handle.stats()
    handle.remove()
    assert all(torch.equal(o[0], ref[0]) and torch.equal(o[1], ref[1]) for o in outs)
    assert first_loads.forwards == 4 and stats.forwards == 5
    # Traced on the first pass, predicted after: no load past the first pass is on demand.
    assert stats.on_demand_loads == first_loads.on_demand_loads
    assert stats.group_loads - first_loads.group_loads == stats.groups


def test_unmarked_calls_count_nothing_and_keep_the_last_group(tmp_path: Path) -> None:
    """What the mark changes (the behaviour before it, kept for a host that marks nothing):
    no pass counts, and the last group computed stays in its slot after the call."""
    model, handle, ref = _offloaded(tmp_path, "pinned")
    with torch.no_grad():
        outs = [model.encode(A, B) for _ in range(3)]
    stats = handle.stats()
    held = handle._engine.current  # the engine's own record of the group in a slot
    with torch.no_grad(), handle.one_pass():
        model.encode(A, B)
    after_marked = handle._engine.current
    handle.remove()
    assert all(torch.equal(o[1], ref[1]) for o in outs)
    assert stats.forwards == 0 and stats.group_loads > 0
    assert held is not None and held.group.name.startswith("large")
    assert after_marked is None, "a marked pass gives its last group's slot back"


def test_a_pass_that_raises_leaves_the_next_one_whole(tmp_path: Path) -> None:
    model, handle, ref = _offloaded(tmp_path, "disk")
    with torch.no_grad():
        with handle.one_pass():
            model.encode(A, B)
        with pytest.raises(RuntimeError, match="mat1 and mat2"), handle.one_pass():
            model.small(B)  # the wrong width: raises inside the pass
        with handle.one_pass():
            out = model.encode(A, B)
    stats = handle.stats()
    handle.remove()
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    assert stats.forwards == 2
