"""A network whose weights wait in their checkpoint, built by the host's own constructor
(offload_core/model/meta_build.py): what the constructor computes is what a plain build
computes, and what the file holds is the file's, never the constructor's initialisation.

The network stands in for what the architecture sweep found in ComfyUI core's networks
(tests/comfyui/test_comfyui_arch_sweep.py): Cosmos' rope position embedder computes its
frequency ranges as non-persistent buffers on the device it is given; HunyuanVideo 1.5 makes
an ``nn.Embedding`` without the device argument, so it is built on the CPU, randomly
initialised, whatever device the rest gets; other networks keep tables computed at build time
as plain attributes. Built on the meta device, the first have no value (Ferry's loader failed
with ``AssertionError: pos_embedder.dim_spatial_range``) and the second kept its random
initialisation instead of the file's weights (the latent differed from UNETLoader's).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from offload_core import BlockLevel, ConfigError, DiskTier, OffloadPolicy, RamTier, apply_offload
from offload_core.model.meta_build import build_on_meta
from offload_core.sources.checkpoint_stream import CheckpointWeights

DM = "diffusion_model."


class Rope(nn.Module):
    def __init__(self, dim: int, device: torch.device | None = None) -> None:
        super().__init__()
        rng = torch.arange(0, dim, 2, device=device).float() / dim
        self.register_buffer("dim_range", rng, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.cos(self.dim_range).repeat(2)


class Block(nn.Module):
    def __init__(self, dim: int, device: torch.device | None, computed: bool) -> None:
        super().__init__()
        self.a = nn.Linear(dim, dim, device=device)
        self.rope = Rope(dim, device) if computed else nn.Identity()
        self.norm = nn.LayerNorm(dim, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.rope(self.a(self.norm(x)))


class Net(nn.Module):
    def __init__(
        self, device: torch.device | None = None, computed: bool = True, dim: int = 16
    ) -> None:
        super().__init__()
        self.inp = nn.Linear(8, dim, device=device)
        self.kind = nn.Embedding(3, dim)  # no device: built on the CPU, randomly initialised
        self.register_buffer("shift", torch.zeros(dim, device=device))  # in the file
        # computed at build time, a plain attribute
        self.table = torch.linspace(0.5, 1.5, dim, device=device) if computed else None
        self.blocks = nn.ModuleList([Block(dim, device, computed) for _ in range(3)])
        self.out = nn.Linear(dim, 8, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x) + self.kind.weight[1] + self.shift
        if self.table is not None:
            x = x * self.table
        for b in self.blocks:
            x = b(x)
        return self.out(x)


class Base(nn.Module):
    """Stands in for ComfyUI's BaseModel: ``config.get_model(sd, "", device=...)`` passes the
    device on to the network's constructor, and the owner holds buffers of its own."""

    def __init__(self, device: torch.device | None = None, computed: bool = True) -> None:
        super().__init__()
        self.diffusion_model = Net(device, computed)
        self.register_buffer("sigmas", torch.linspace(0.0, 1.0, 5))  # not the network's


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    src = Net()  # nothing computed is in the file: it serves both networks
    with torch.no_grad():
        for p in [*src.parameters(), src.shift]:
            p.copy_(torch.randn_like(p) * 0.3)
    path = tmp_path / "net.safetensors"
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(path))
    return path


def plain(path: Path, computed: bool = True) -> Base:
    """As ComfyUI's loader does it: built on the CPU, then the file's tensors copied in."""
    from safetensors.torch import load_file

    torch.manual_seed(1)  # another initialisation than the lazy build's: the file must win
    base = Base(computed=computed)
    base.diffusion_model.load_state_dict(load_file(str(path)))
    return base


def lazy(path: Path, computed: bool = True) -> Base:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        held = {DM + k for k in f.keys()}  # noqa: SIM118 - safe_open is not a mapping
    torch.manual_seed(2)
    return build_on_meta(lambda device: Base(device, computed), held)


def run(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.linspace(-1.0, 1.0, 16).reshape(2, 8))  # type: ignore[no-any-return]


def test_what_the_file_holds_waits_on_meta_and_the_rest_is_built(checkpoint: Path) -> None:
    base = lazy(checkpoint)
    net = base.diffusion_model
    held = {k for k, _ in net.state_dict().items()}
    assert {k for k, v in net.state_dict().items() if v.device.type == "meta"} == held
    assert net.blocks[0].rope.dim_range.device.type == "cpu"  # non-persistent: computed
    assert torch.equal(net.table, torch.linspace(0.5, 1.5, 16))  # a computed attribute
    assert base.sigmas.device.type == "cpu"  # the file does not hold it: as built


# Without the computed tensors, the network has only the layer built on the CPU to get wrong.
@pytest.mark.parametrize("computed", [True, False])
def test_a_plain_read_equals_the_host_loader(checkpoint: Path, computed: bool) -> None:
    expected = run(plain(checkpoint, computed).diffusion_model)
    net = lazy(checkpoint, computed).diffusion_model
    CheckpointWeights.open(checkpoint, net).materialize(net, "cpu")
    assert torch.equal(run(net), expected)


@pytest.mark.parametrize("computed", [True, False])
@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_an_offload_from_the_file_equals_the_host_loader(
    checkpoint: Path, tmp_path: Path, tier: str, computed: bool
) -> None:
    expected = run(plain(checkpoint, computed).diffusion_model)
    net = lazy(checkpoint, computed).diffusion_model
    policy = OffloadPolicy(
        level=BlockLevel(1), tier=DiskTier(str(tmp_path / "ferry")) if tier == "disk" else RamTier()
    )
    handle = apply_offload(
        net, policy, onload_device="cpu", weights=CheckpointWeights.open(checkpoint, net)
    )
    assert torch.equal(run(net), expected)
    assert torch.equal(run(net), expected)  # read from their sources again
    handle.remove()


def test_a_tensor_computed_from_a_weight_is_refused_naming_it() -> None:
    class FromWeight(nn.Module):
        def __init__(self, device: torch.device | None = None) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4, device=device)
            self.register_buffer("norm", self.lin.weight.detach().norm(dim=1), persistent=False)

    with pytest.raises(ConfigError) as info:
        build_on_meta(FromWeight, {"lin.weight", "lin.bias"})
    assert info.value.setting == "build" and "norm" in str(info.value)
