"""The binding that keeps one offload across ComfyUI's load/unload cycles (no ComfyUI needed)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.conftest import PACK_NAME, load_pack

load_pack()
binding_mod = importlib.import_module(f"{PACK_NAME}.nodes.patcher.live_layout")
config = importlib.import_module(f"{PACK_NAME}.nodes.planning.config")
oc = importlib.import_module(f"{PACK_NAME}.offload_core")
ComfyLayout = binding_mod.ComfyLayout


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.blocks = nn.ModuleList([Block() for _ in range(4)])
        self.out = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x)


class Owner:
    """Stands in for ComfyUI's BaseModel: the object every clone shares."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.diffusion_model = Net().requires_grad_(False)


def cfg(tier: str = "ram", name: str = "net", **kw: object) -> object:
    flat = dict(
        level="block", blocks_per_group=2, tier=tier, disk_path="", prefetch_depth=1, vram_budget=""
    )
    flat.update(kw)
    return config.ComfyOffload(config.policy_from_inputs(**flat), name=name)


@pytest.fixture
def owner() -> Owner:
    o = Owner()
    yield o
    b = o.__dict__.get(binding_mod.ATTR)
    if b is not None:
        b.release()


X = torch.randn(2, 8, generator=torch.Generator().manual_seed(1))


def _nbytes(*modules: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for m in modules for p in m.parameters())


def test_binding_lives_on_the_shared_owner(owner: Owner) -> None:
    b = ComfyLayout.of(owner, owner.diffusion_model)
    assert ComfyLayout.of(owner, owner.diffusion_model) is b
    assert not b.live and b.device_bytes() == 0


@pytest.mark.parametrize("tier", ["pinned", "ram", "disk"])
def test_ensure_offloads_exactly_and_release_restores(
    owner: Owner, tier: str, tmp_path: Path
) -> None:
    net = owner.diffusion_model
    with torch.no_grad():
        ref = net(X)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    b = ComfyLayout.of(owner, net)
    c = cfg(tier, disk_path=str(tmp_path) if tier == "disk" else "")
    calls = []
    assert b.ensure(c, "cpu", None, lambda: calls.append(1)) is True
    assert b.live and b.serves(c, "cpu") and calls == [1]
    # From Net's own parameters: inp and out (outside the block list) stay on the device,
    # and the blocks stream two to a group through depth + 1 = 2 slots of one group's slab
    # (its tensors are multiples of 64 bytes, so packed without gaps, then rounded up to
    # whole 4 KiB pages).
    outside = _nbytes(net.inp, net.out)
    slot = -(-_nbytes(net.blocks[0], net.blocks[1]) // 4096) * 4096
    assert (outside, slot) == (576 + 544, 8192)
    assert b.device_bytes() == outside + 2 * slot
    with torch.no_grad():
        assert torch.equal(net(X), ref)
    assert b.handle.stats().forwards == 1
    # Same config, same weights: nothing is laid out again.
    assert b.ensure(c, "cpu", None, lambda: calls.append(1)) is False and calls == [1]
    assert b.release() is True and not b.live and b.release() is False
    after = net.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert oc.live_offloads() == []


def test_new_weights_or_config_lay_out_again(owner: Owner) -> None:
    b = ComfyLayout.of(owner, owner.diffusion_model)
    calls: list[str] = []
    b.ensure(cfg(), "cpu", "uuid-a", lambda: calls.append("a"))
    first = b.handle
    b.ensure(cfg(), "cpu", "uuid-b", lambda: calls.append("b"))  # a LoRA changed the weights
    assert first.removed and b.handle is not first and calls == ["a", "b"]
    b.ensure(cfg(prefetch_depth=2), "cpu", "uuid-b", lambda: calls.append("c"))  # a new policy
    assert calls == ["a", "b", "c"] and b.handle.policy.prefetch_depth == 2
    assert len(oc.live_offloads()) == 1


class Patcher:
    """Stands in for a ModelPatcher clone (only its identity matters here)."""


def test_detach_keeps_the_layout_only_for_a_ferry_patcher_with_the_same_config(
    owner: Owner,
) -> None:
    b = ComfyLayout.of(owner, owner.diffusion_model)
    b.ensure(cfg(), "cpu", None, lambda: None)
    p = Patcher()
    b.handshake.set_owner(p)
    # load_models_gpu asked a Ferry patcher with this config: its own reload keeps the layout.
    b.handshake.mark_loading(cfg())
    assert b.handshake.should_release_on_detach(p) is False
    # The mark is consumed: a later detach with no mark (a plain patcher loads) releases.
    assert b.handshake.should_release_on_detach(p) is True
    b.handshake.mark_loading(cfg(tier="pinned"))  # a Ferry patcher with another config
    assert b.handshake.should_release_on_detach(p) is True
    b.handshake.mark_loading(None)
    assert b.handshake.should_release_on_detach(p) is True


def test_a_garbage_collected_clone_does_not_release_the_owners_layout(owner: Owner) -> None:
    # ModelPatcher.__del__ calls detach(unpatch_all=False) on every clone that dies.
    b = ComfyLayout.of(owner, owner.diffusion_model)
    b.ensure(cfg(), "cpu", None, lambda: None)
    sampling, stray = Patcher(), Patcher()
    b.handshake.set_owner(sampling)
    assert b.handshake.should_release_on_detach(stray) is False
    del sampling  # the owner is gone: nobody uses the layout any more
    assert b.handshake.should_release_on_detach(stray) is True
    b.release()
    assert b.handshake.owner() is None


def test_plan_validates_before_anything_moves(owner: Owner) -> None:
    b = ComfyLayout.of(owner, owner.diffusion_model)
    with pytest.raises(oc.GroupingError) as info:
        b.plan(cfg(blocks_per_group=9), "cpu")
    assert info.value.setting == "blocks_per_group"
    assert not b.live
    p = b.plan(cfg(), "cpu")
    assert b.plan(cfg(), "cpu") is p  # cached
    b.ensure(cfg(), "cpu", None, lambda: None)
    assert b.plan(cfg(), "cpu") is b.handle.plan


def test_failed_prepare_leaves_the_module_plain(owner: Owner) -> None:
    b = ComfyLayout.of(owner, owner.diffusion_model)

    def boom() -> None:
        raise RuntimeError("LoRA file is broken")

    with pytest.raises(RuntimeError):
        b.ensure(cfg(), "cpu", None, boom)
    assert not b.live and oc.live_offloads() == []


def test_panel_apply_releases_the_nodes_layout_for_the_next_prompt(owner: Owner) -> None:
    owner.model_loaded_weight_memory = 123  # ComfyUI's count on its BaseModel
    b = ComfyLayout.of(owner, owner.diffusion_model)
    b.ensure(cfg(), "cpu", None, lambda: None)
    line = binding_mod.release_from_panel(b.handle, None)
    assert "released" in line and not b.live and oc.live_offloads() == []
    assert owner.model_loaded_weight_memory == 0

    class Stranger:
        name = "other"

    assert "left as it is" in binding_mod.release_from_panel(Stranger(), None)
