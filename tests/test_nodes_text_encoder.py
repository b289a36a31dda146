"""What Ferry Offload Text Encoder relies on, without ComfyUI: a CLIP's patcher holds the text
encoder itself, so the binding lives on that module and lays out the module whole
(text_encoder_patcher.py); core never calls that module's forward, only each encoder's
(``encode_token_weights`` -> ``SDClipModel.forward``), so the layout must stream every encoder's
groups and give the same embeddings to the bit through those calls alone.

The encoders here have the module paths of core's (T5 ``transformer.encoder.block``, CLIP
``transformer.text_model.encoder.layers``, Llama/Gemma ``transformer.model.layers``), with a
small block of linear layers and norms of their own; the real ones run in
tests/comfyui/test_comfyui_text_encoder.py.
"""

from __future__ import annotations

import gc
import importlib
import weakref
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.conftest import PACK_NAME, load_pack
from tests.test_nodes_binding import cfg

load_pack()
binding_mod = importlib.import_module(f"{PACK_NAME}.nodes.patcher.live_layout")
grouping = importlib.import_module(f"{PACK_NAME}.offload_core.model.grouping")
oc = importlib.import_module(f"{PACK_NAME}.offload_core")
ComfyLayout = binding_mod.ComfyLayout
W = 16


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(W)
        self.up = nn.Linear(W, 4 * W)
        self.down = nn.Linear(4 * W, W)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Stack(nn.Module):
    """``layers`` under the attribute path core's encoder has them at."""

    def __init__(self, n: int, path: str) -> None:
        super().__init__()
        *parents, leaf = path.split(".")
        holder: nn.Module = self
        for name in parents:
            child = nn.Module()
            holder.add_module(name, child)
            holder = child
        holder.add_module(leaf, nn.ModuleList(Layer() for _ in range(n)))
        self.path = path
        self.embed = nn.Embedding(64, W)
        self.final_norm = nn.LayerNorm(W)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.get_submodule(self.path):
            x = layer(x)
        return self.final_norm(x)


class Encoder(nn.Module):
    """Stands in for core's SDClipModel: its forward is what core calls."""

    def __init__(self, n: int, path: str) -> None:
        super().__init__()
        self.transformer = Stack(n, path)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.transformer(tokens)


class FluxLikeClip(nn.Module):
    """Stands in for a multi-encoder cond_stage_model (FluxClipModel: clip_l + t5xxl); it has
    no forward of its own that core calls: ``encode`` calls each encoder's."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.clip_l = Encoder(3, "text_model.encoder.layers")
        self.t5xxl = Encoder(5, "encoder.block")
        self.gemma2_2b = Encoder(4, "model.layers")
        self.requires_grad_(False)

    def encode(self, tokens: torch.Tensor) -> list[torch.Tensor]:
        with torch.no_grad():
            return [self.clip_l(tokens), self.t5xxl(tokens), self.gemma2_2b(tokens)]


TOKENS = torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(1))
LISTS = {
    "clip_l.transformer.text_model.encoder.layers": 3,
    "t5xxl.transformer.encoder.block": 5,
    "gemma2_2b.transformer.model.layers": 4,
}


def test_every_encoders_repeated_layers_are_found() -> None:
    found = grouping.find_block_lists(FluxLikeClip())
    assert {name: len(m) for name, m in found} == LISTS


@pytest.mark.parametrize("tier", ["pinned", "ram", "disk"])
@pytest.mark.parametrize("level", ["block", "leaf"])
def test_encoders_called_one_by_one_give_the_same_embeddings(
    tier: str, level: str, tmp_path: Path
) -> None:
    te = FluxLikeClip()
    ref = te.encode(TOKENS)
    before = {k: v.clone() for k, v in te.state_dict().items()}
    b = ComfyLayout.of(te, te)  # as the text encoder's patcher binds: the model is the network
    c = cfg(tier, level=level, blocks_per_group=1, disk_path=str(tmp_path))
    assert b.ensure(c, "cpu", None, lambda: None) is True
    if level == "block":
        assert [g.name for g in b.handle.plan.grouping.groups] == [
            f"{name}.{i}" for name, n in LISTS.items() for i in range(n)
        ]
    for _ in range(2):  # the second encode starts with a layout the first one left behind
        got = te.encode(TOKENS)
        assert all(torch.equal(g, r) for g, r in zip(got, ref, strict=True))
    stats = b.handle.stats()
    assert stats.group_loads >= 2 * len(b.handle.plan.grouping.groups)
    assert b.ensure(c, "cpu", None, lambda: None) is False  # an unchanged prompt: kept
    assert b.release() is True and oc.live_offloads() == []
    after = te.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_marked_text_encoder_is_freed_without_a_garbage_collection() -> None:
    """mark_passes holds the module weakly: a marked encoder ComfyUI drops goes at once, as
    an unmarked one does (a cycle would keep it, and its layout's memory, until gc runs)."""
    passes = importlib.import_module(f"{PACK_NAME}.seam.passes")
    te = FluxLikeClip()
    te.encode_token_weights = te.encode  # type: ignore[method-assign]
    ref = te.encode(TOKENS)
    passes.mark_passes(te, ("encode_token_weights", "encode"))
    assert all(torch.equal(g, r) for g, r in zip(te.encode(TOKENS), ref, strict=True))
    gone = weakref.ref(te)
    gc.disable()
    try:
        del te
        assert gone() is None, gc.get_referrers(gone())
    finally:
        gc.enable()


def test_each_encode_is_one_pass_of_the_layout(tmp_path: Path) -> None:
    """[Note: a pass the host marks]: core calls ``encode_token_weights``, never the text
    encoder's forward; marked, each call is one pass (traced, predicted, counted) and gives its
    last group's slot back, with the same embeddings."""
    passes = importlib.import_module(f"{PACK_NAME}.seam.passes")
    entry = ("encode_token_weights",)  # nodes/text_encoder_patcher.py ENTRY_METHODS
    te = FluxLikeClip()
    te.encode_token_weights = te.encode  # type: ignore[method-assign]  # core's entry method
    ref = te.encode(TOKENS)
    passes.mark_passes(te, entry)
    passes.mark_passes(te, entry)  # once per encoder: a second mark wraps nothing
    assert all(torch.equal(g, r) for g, r in zip(te.encode_token_weights(TOKENS), ref))  # no layout
    b = ComfyLayout.of(te, te)
    assert b.ensure(
        cfg("disk", blocks_per_group=1, disk_path=str(tmp_path)), "cpu", None, lambda: None
    )
    outs = [te.encode_token_weights(TOKENS) for _ in range(3)]
    stats, engine = b.handle.stats(), b.handle._engine
    assert engine.current is None, "the last group's slot is given back after each encode"
    assert b.release() is True
    assert all(torch.equal(g, r) for out in outs for g, r in zip(out, ref, strict=True))
    assert stats.forwards == 3
    assert stats.group_loads == 3 * stats.groups and stats.on_demand_loads <= 1
