"""A host's quantized layers streamed from their file (issue 40): the host's loader builds each
layer's weight as a tensor subclass around tensors it is given (ComfyUI's ``QuantizedTensor``
around fp8 data and a scale; here ``Scaled``, the same shape of thing in miniature: it detaches
its data and clones its scale on the way, as ComfyUI's does), and the trace says which file key
each inner tensor holds (``LoadTrace.inner_sources``), so the layout reads them as stored and
rebuilds the subclass around them. And several files as one source (``CheckpointSet``): each
tensor read from its own file, a group read verbatim keeps its file as its disk-tier source.
The real loaders run in tests/comfyui/test_comfyui_core_quant.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.utils._pytree import tree_map

from offload_core import BlockLevel, DiskTier, LeafLevel, OffloadPolicy, RamTier, apply_offload
from offload_core.model import meta_build
from offload_core.sources.checkpoint import CheckpointIndex
from offload_core.sources.checkpoint_stream import CheckpointSet, CheckpointWeights
from offload_core.sources.load_trace import LoadTrace, header_state_dict, unsourced

W = 32


class Scaled(torch.Tensor):
    """fp8 data and a float32 scale, dequantized by any op but the aliasing ones."""

    @staticmethod
    def __new__(cls, qdata: torch.Tensor, scale: torch.Tensor) -> Scaled:
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[no-any-return]
            cls, qdata.shape, dtype=torch.float32, device=qdata.device, requires_grad=False
        )

    def __init__(self, qdata: torch.Tensor, scale: torch.Tensor) -> None:
        self.qdata, self.scale = qdata, scale

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["qdata", "scale"], None

    @staticmethod
    def __tensor_unflatten__(
        inner: dict[str, torch.Tensor], ctx: Any, size: Any, stride: Any
    ) -> Scaled:
        return Scaled(inner["qdata"], inner["scale"])

    def dequantize(self) -> torch.Tensor:
        return self.qdata.float() * self.scale

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in (torch.ops.aten.detach.default, torch.ops.aten.alias.default):
            t = args[0]
            return Scaled(func(t.qdata), t.scale.clone())  # ComfyUI's clones its params
        if func is torch.ops.aten._to_copy.default:
            t = args[0]
            dev = kwargs.get("device", t.device)
            return Scaled(t.qdata.to(dev), t.scale.to(dev))
        plain = tree_map(lambda x: x.dequantize() if isinstance(x, Scaled) else x, args)
        return func(*plain, **kwargs)


class QuantLinear(nn.Linear):
    """Loads itself its own way: ``weight`` and ``weight_scale`` into a ``Scaled`` weight."""

    def _load_from_state_dict(self, sd: dict[str, Any], prefix: str, *args: Any) -> None:
        q, scale = sd.pop(prefix + "weight"), sd.pop(prefix + "weight_scale")
        self.weight = nn.Parameter(Scaled(q, scale), requires_grad=False)
        self.bias = nn.Parameter(sd.pop(prefix + "bias").float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        w = w.dequantize() if isinstance(w, Scaled) else w
        return nn.functional.linear(x, w, self.bias)


class Net(nn.Module):
    def __init__(self, device: torch.device | None, depth: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(4, W, device=device)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(W, device=device), QuantLinear(W, W, device=device))
            for _ in range(depth)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for b in self.blocks:
            x = x + b(x)
        return x


def quantized_file(path: Path, seed: int, prefix: str = "") -> Path:
    torch.manual_seed(seed)
    src = Net(None)
    sd: dict[str, torch.Tensor] = {}
    for k, v in src.state_dict().items():
        v = torch.randn_like(v) * 0.3
        if k.endswith("1.weight"):  # the QuantLinear's
            scale = (v.abs().max() / 448.0).reshape(())
            sd[prefix + k] = (v / scale).to(torch.float8_e4m3fn)
            sd[prefix + k + "_scale"] = scale
        else:
            sd[prefix + k] = v
    sd[prefix + "odd"] = torch.zeros(3, dtype=torch.uint8)  # the scales at odd offsets too
    save_file(sd, str(path))
    return path


def loaded(sd: dict[str, torch.Tensor], device: torch.device | None) -> Net:
    net = Net(device)
    net.load_state_dict({k: v for k, v in sd.items() if not k.endswith("odd")}, strict=False)
    return net


def traced(path: Path) -> tuple[Net, dict[str, str], dict[str, tuple[str, ...]]]:
    original = header_state_dict(CheckpointIndex.open(path, "unet_name"))
    trace = LoadTrace([original])
    with trace:
        net = meta_build.build_on_meta(lambda device: Net(device), set(original))
        net.load_state_dict(dict(original), strict=False)
    keys, parts = trace.sources(net)[0], trace.inner_sources(net)[0]
    return net, keys, parts


def run(net: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return net(torch.linspace(-1.0, 1.0, 12).reshape(3, 4))  # type: ignore[no-any-return]


def test_each_inner_tensor_knows_its_key(tmp_path: Path) -> None:
    path = quantized_file(tmp_path / "q.safetensors", 0)
    net, keys, parts = traced(path)
    assert parts["blocks.0.1.weight"] == ("blocks.0.1.weight", "blocks.0.1.weight_scale")
    assert len(parts) == 3
    assert [n for n in unsourced(net, [keys]) if n not in parts] == []
    assert isinstance(net.blocks[0][1].weight, Scaled)
    assert net.blocks[0][1].weight.device.type == "meta"


@pytest.mark.parametrize(
    "tier,level", [("ram", "block"), ("disk", "block"), ("ram", "leaf"), ("disk", "leaf")]
)
def test_quantized_layers_stream_bit_equal(tmp_path: Path, tier: str, level: str) -> None:
    path = quantized_file(tmp_path / "q.safetensors", 0)
    expected = run(loaded(load_file(str(path)), None))
    net, keys, parts = traced(path)
    folder = tmp_path / "ferry"
    policy = OffloadPolicy(
        level=BlockLevel(1) if level == "block" else LeafLevel(),
        tier=DiskTier(str(folder)) if tier == "disk" else RamTier(),
    )
    weights = CheckpointWeights(CheckpointIndex.open(path, "unet_name"), keys, parts=parts)
    handle = apply_offload(net, policy, onload_device="cpu", weights=weights)
    assert torch.equal(run(net), expected)
    assert torch.equal(run(net), expected)
    if tier == "disk":  # the stored fp8 data and scales are the slabs: nothing written
        assert not list(folder.rglob("group-*")), list(folder.rglob("*"))
    handle.remove()  # every tensor back in its file: on meta, the subclass as the host built it
    assert isinstance(net.blocks[0][1].weight, Scaled)
    assert net.blocks[0][1].weight.device.type == "meta"
    handle = apply_offload(net, policy, onload_device="cpu", weights=weights)  # laid out again
    assert torch.equal(run(net), expected)
    handle.remove()


def test_materialize_builds_the_subclass_as_the_host_did(tmp_path: Path) -> None:
    path = quantized_file(tmp_path / "q.safetensors", 0)
    plain = loaded(load_file(str(path)), None)
    net, keys, parts = traced(path)
    CheckpointWeights(CheckpointIndex.open(path, "u"), keys, parts=parts).materialize(net, "cpu")
    w = net.blocks[1][1].weight
    assert isinstance(w, Scaled) and w.qdata.dtype == torch.float8_e4m3fn
    assert torch.equal(w.qdata.view(torch.uint8), plain.blocks[1][1].weight.qdata.view(torch.uint8))
    assert torch.equal(run(net), run(plain))


class Pair(nn.Module):
    """Two networks, each from its own file (a CLIP-L beside a T5)."""

    def __init__(self, device: torch.device | None) -> None:
        super().__init__()
        self.a, self.b = Net(device), Net(device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) + self.b(x)


@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_every_file_of_a_multi_file_load_streams(tmp_path: Path, tier: str) -> None:
    paths = [quantized_file(tmp_path / f"{n}.safetensors", s) for n, s in (("a", 1), ("b", 2))]
    ref = Pair(None)
    ref.a, ref.b = (loaded(load_file(str(p)), None) for p in paths)
    expected = run(ref)
    pair = Pair(torch.device("meta"))
    members = []
    for name, path in zip(("a", "b"), paths):
        net, keys, parts = traced(path)
        setattr(pair, name, net)
        members.append(
            CheckpointWeights(
                CheckpointIndex.open(path, f"clip_{name}"),
                {f"{name}.{k}": v for k, v in keys.items()},
                parts={f"{name}.{k}": v for k, v in parts.items()},
            )
        )
    folder = tmp_path / "ferry"
    policy = OffloadPolicy(
        level=BlockLevel(1), tier=DiskTier(str(folder)) if tier == "disk" else RamTier()
    )
    weights = CheckpointSet(members)
    handle = apply_offload(pair, policy, onload_device="cpu", weights=weights)
    assert len(handle.plan.grouping.groups) == 6  # both networks' blocks stream
    assert torch.equal(run(pair), expected)
    assert torch.equal(run(pair), expected)
    if tier == "disk":  # each group read from its own file: nothing written
        assert not list(folder.rglob("group-*")), list(folder.rglob("*"))
    handle.remove()
    assert all(p.device.type == "meta" for p in pair.parameters())
