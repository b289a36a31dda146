"""Each kind of network's site (seam/site.py) against stand-ins shaped as the host objects it
names (core's ModelPatcher over a BaseModel, its CLIP, ControlNet, MODEL_PATCH and
ClipVisionModel; Forge's UNet patcher and CLIP): where the patcher is, where the network is on
the patcher's model and what lies outside it, the copy a node hands on, and the passes a host
marks. Then one network of each kind laid out through the seam and marked as the host does:
every output ``torch.equal`` to the plain network's."""

from __future__ import annotations

import copy
import importlib
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.conftest import PACK_NAME, load_pack

load_pack()
site = importlib.import_module(f"{PACK_NAME}.seam.site")
passes = importlib.import_module(f"{PACK_NAME}.seam.passes")
oc = importlib.import_module(f"{PACK_NAME}.offload_core")


class Blocks(nn.Module):
    def __init__(self, n: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.GELU()) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        return x

    def control_block(self, x: torch.Tensor, i: int) -> torch.Tensor:  # a model patch's call
        return self.blocks[i](x)

    def encode_token_weights(self, x: torch.Tensor) -> torch.Tensor:  # a CLIP's call
        return self.forward(x)


class Patcher:
    """core's ModelPatcher, as far as a site reads it: ``model``."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model


class BaseModel(nn.Module):
    """core's BaseModel: the diffusion model beside what lies outside it."""

    def __init__(self) -> None:
        super().__init__()
        self.diffusion_model = Blocks()
        self.model_sampling = nn.Linear(1, 1)


class Holder:
    """A CLIP, a ControlNet or a ClipVisionModel: the network beside its patcher."""

    def __init__(self, patcher_attr: str, mirror: str) -> None:
        net = Blocks()
        setattr(self, patcher_attr, Patcher(net))
        setattr(self, mirror, net)

    def clone(self) -> Holder:  # CLIP.clone
        return copy.copy(self)

    def copy(self) -> Holder:  # ControlNet.copy: shares the patcher (core's ControlNet does)
        return copy.copy(self)


def host_object(s: Any) -> Any:
    if s is site.DIFFUSION_MODEL:
        return Patcher(BaseModel())
    if not s.patcher:
        return Patcher(Blocks())
    return Holder(s.patcher, s.mirror)


@pytest.mark.parametrize("s", site.SITES, ids=lambda s: s.kind.value)
def test_each_site_finds_its_patcher_network_and_what_lies_outside(s: Any) -> None:
    obj = host_object(s)
    patcher = s.patcher_of(obj)
    assert isinstance(patcher, Patcher)
    net = s.network_of(patcher.model)
    assert isinstance(net, Blocks)
    outside = s.outside(patcher.model)
    if s is site.DIFFUSION_MODEL:
        assert outside == [patcher.model.model_sampling]  # BaseModel's other children
    else:
        assert outside == [] and net is patcher.model  # the patcher's model is the network
    if s.mirror:
        assert getattr(obj, s.mirror) is net
    assert s.title("x") == f"{s.kind.label}: x"


def test_a_site_says_when_the_object_holds_no_network() -> None:
    # A T2I adapter: a CONTROL_NET with no patcher of its own; a MODEL with no diffusion_model.
    assert site.CONTROLNET.patcher_of(object()) is None
    assert site.DIFFUSION_MODEL.network_of(Patcher(nn.Linear(1, 1)).model) is None
    assert site.TEXT_ENCODER.network_of(None) is None


def test_every_kind_has_one_site_and_its_own_control() -> None:
    kinds = [s.kind for s in site.SITES]
    # A kind Ferry offloads is a new site, and the other way round (a VAE is listed, never offloaded).
    assert kinds == list(oc.offload_kind.OFFLOADED)
    assert len({s.control for s in site.SITES}) == len(site.SITES)
    # Forge offloads the two its accordion has switches for.
    forge = {s.kind.value: s.forge_control for s in site.SITES if s.forge_control}
    assert forge == {"model": "enabled", "text_encoder": "text_encoder"}
    # bake_lora (GGUF LoRA computed once at layout) applies to the diffusion model alone.
    assert [s.kind.value for s in site.SITES if s.bakes] == ["model"]


@pytest.mark.parametrize("s", site.SITES, ids=lambda s: s.kind.value)
def test_laid_out_through_its_sites_calls_it_gives_the_plain_output(s: Any, tmp_path: Path) -> None:
    obj = host_object(s)
    net = s.network_of(s.patcher_of(obj).model).requires_grad_(False)
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
    calls = {
        "forward": lambda: net(x),
        "encode_token_weights": lambda: net.encode_token_weights(x),
        "control_block": lambda: net.control_block(net.embed(x), 2),
    }
    host_calls = [m for m in (*s.passes, "control_block", "forward") if m in calls]
    want = {m: calls[m]() for m in host_calls}
    # What the host's load step does (nodes/patcher/load_steps.py):
    passes.mark_passes(net, s.passes)
    tier = oc.DiskTier(str(tmp_path)) if s is site.CLIP_VISION else oc.RamTier()
    handle = oc.apply_offload(net, oc.OffloadPolicy(tier=tier), kind=s.kind, name="tiny")
    try:
        for m in host_calls:
            assert torch.equal(calls[m](), want[m]), m
        assert handle.kind is s.kind and handle.stats().group_loads > 0
    finally:
        handle.remove()
    for m in host_calls:
        assert torch.equal(calls[m](), want[m]), m
