"""A text encoder whose weights wait in its files, built by its host's own loader
(offload_core/sources/load_trace.py; nodes/loading/text_encoder_stream.py uses it with ComfyUI's
``load_text_encoder_state_dicts``): the host is given meta tensors made from the files'
headers, routes each file to an encoder with its own key renames, and the trace says which file
key each parameter got; the layout then reads the files as the host would have, to the bit.

The host here does what ComfyUI's CLIP loading does to files, in miniature: it reads a
tokenizer blob from the state dict while it builds, builds on the device it is given (meta),
keeps a parameter its constructor sets and no file holds (ComfyUI's ``logit_scale``), routes a
state dict to the encoder whose keys it has and adds the ``transformer.`` level the file lacks,
renames a key (``lm_head.weight``, which a layer that loads itself, as ComfyUI's lazily built
Linears do under dynamic VRAM, copies), and with ``transpose`` replaces one tensor by a new one
(ComfyUI's old ``text_projection``). The real loader runs in
tests/comfyui/test_comfyui_text_encoder.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from offload_core import BlockLevel, DiskTier, OffloadPolicy, RamTier, apply_offload
from offload_core.model import meta_build
from offload_core.sources.checkpoint import CheckpointIndex
from offload_core.sources.checkpoint_stream import CheckpointWeights
from offload_core.sources.load_trace import LoadTrace, header_state_dict, unsourced

W = 16


class Block(nn.Module):
    def __init__(self, device: torch.device | None) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(W, device=device)
        self.ff = nn.Linear(W, W, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(self.norm(x))


class SelfLoading(nn.Linear):
    """Loads itself its own way, skipping nn.Module's load hooks, and keeps a copy of what it
    is given (ComfyUI's lazily built Linears under dynamic VRAM do both)."""

    def _load_from_state_dict(self, sd: dict[str, Any], prefix: str, *args: Any) -> None:
        self.weight = nn.Parameter(sd[prefix + "weight"].clone(), requires_grad=False)


class Transformer(nn.Module):
    def __init__(self, device: torch.device | None, depth: int) -> None:
        super().__init__()
        self.embed = nn.Linear(4, W, device=device)
        self.block = nn.ModuleList(Block(device) for _ in range(depth))
        self.lm_head = SelfLoading(W, W, bias=False, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for b in self.block:
            x = b(x)
        return self.lm_head(x)


class Encoder(nn.Module):
    def __init__(self, device: torch.device | None, depth: int) -> None:
        super().__init__()
        self.transformer = Transformer(device, depth)

    def load_sd(self, sd: dict[str, torch.Tensor]) -> None:
        self.transformer.load_state_dict(sd, strict=False)


class Host(nn.Module):
    """Two encoders (a small one, a deep one), as a CLIP-L beside a T5."""

    def __init__(self, device: torch.device | None) -> None:
        super().__init__()
        self.small = Encoder(device, 1)
        self.deep = Encoder(device, 4)
        self.logit_scale = nn.Parameter(torch.tensor(4.6055))  # the constructor's, no file's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.deep.transformer(x) * self.logit_scale + self.small.transformer(x)


def host_load(
    sds: list[dict[str, torch.Tensor]], device: torch.device | None, transpose: bool = False
) -> tuple[Host, str]:
    """The host's loader: the tokenizer read at build, renames, routing by key presence."""
    tokenizer = bytes(sds[0].pop("tokenizer").tolist()).decode()
    host = Host(device)
    for sd in sds:
        if "model.lm_head.weight" in sd:  # a prefix some files miss
            sd["lm_head.weight"] = sd.pop("model.lm_head.weight")
        if transpose and "block.3.ff.weight" not in sd:  # the small file's
            sd["embed.weight"] = sd["embed.weight"].transpose(0, 1).transpose(0, 1).clone()
        target = host.deep if "block.3.ff.weight" in sd else host.small
        target.load_sd(sd)
    return host, tokenizer


@pytest.fixture
def files(tmp_path: Path) -> list[Path]:
    torch.manual_seed(0)
    src = Host(None)
    paths = []
    for name, enc in (("small", src.small), ("deep", src.deep)):
        sd = {k: torch.randn_like(v) * 0.3 for k, v in enc.transformer.state_dict().items()}
        sd["model.lm_head.weight"] = sd.pop("lm_head.weight")
        if name == "small":
            sd["tokenizer"] = torch.frombuffer(bytearray(b"spm"), dtype=torch.uint8)
        paths.append(tmp_path / f"{name}.safetensors")
        save_file(sd, str(paths[-1]))
    return paths


def plain(paths: list[Path]) -> Host:
    torch.manual_seed(1)  # another initialisation: the files must win
    return host_load([load_file(str(p)) for p in paths], None)[0]


def traced(paths: list[Path], transpose: bool = False) -> tuple[Host, list[dict[str, str]]]:
    trace = LoadTrace([header_state_dict(CheckpointIndex.open(p, "te")) for p in paths])
    with trace:
        host, tokenizer = host_load(trace.state_dicts, torch.device("meta"), transpose)
    assert tokenizer == "spm"  # the blob was read, not left on meta
    keys = trace.sources(host)
    meta_build.settle_on_meta(host, set().union(*keys))
    return host, keys


def run(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.linspace(-1.0, 1.0, 12).reshape(3, 4))  # type: ignore[no-any-return]


def test_each_tensor_knows_its_file_and_key(files: list[Path]) -> None:
    host, keys = traced(files)
    small, deep = keys
    assert small["small.transformer.embed.weight"] == "embed.weight"
    assert small["small.transformer.lm_head.weight"] == "model.lm_head.weight"  # renamed
    assert deep["deep.transformer.block.3.ff.bias"] == "block.3.ff.bias"
    assert not any(k.startswith("deep.") for k in small)
    assert len(deep) == len(host.deep.state_dict()) and len(small) == len(host.small.state_dict())
    assert unsourced(host, keys) == []
    assert all(p.device.type == "meta" for p in host.deep.parameters())
    assert host.logit_scale.item() == pytest.approx(4.6055)  # as constructed: no file has it


def test_a_tensor_the_host_replaced_has_no_source(files: list[Path]) -> None:
    host, keys = traced(files, transpose=True)
    assert unsourced(host, keys) == ["small.transformer.embed.weight"]


def test_a_kept_trace_gives_the_value_the_host_computed(files: list[Path]) -> None:
    # Ferry Load Checkpoint's second build (nodes/loading/checkpoint_stream.py): the file's
    # tensors read, each tensor the host replaced is taken as the host gave it.
    host, keys = traced(files, transpose=True)
    (name,) = unsourced(host, keys)
    sds = [load_file(str(p)) for p in files]
    trace = LoadTrace(sds, keep=True)
    with trace:
        again, _ = host_load(trace.state_dicts, torch.device("meta"), transpose=True)
    given = trace.given(again)
    assert torch.equal(given[name], plain(files).get_parameter(name))
    assert given["deep.transformer.block.3.ff.bias"] is sds[1]["block.3.ff.bias"]


@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_the_deep_file_streams_and_equals_the_host_loader(
    files: list[Path], tmp_path: Path, tier: str
) -> None:
    expected = run(plain(files))
    host, (small_keys, deep_keys) = traced(files)
    _read_small(host, files[0], small_keys)
    folder = tmp_path / "ferry"
    policy = OffloadPolicy(
        level=BlockLevel(1), tier=DiskTier(str(folder)) if tier == "disk" else RamTier()
    )
    weights = CheckpointWeights(CheckpointIndex.open(files[1], "te"), deep_keys)
    handle = apply_offload(host, policy, onload_device="cpu", weights=weights)
    assert torch.equal(run(host), expected)
    assert torch.equal(run(host), expected)  # read from their sources again
    if tier == "disk":  # the deep file's groups are read from it: nothing of them written
        assert len(handle.plan.grouping.groups) == 4  # the deep encoder's blocks
        assert not list(folder.rglob("group-*")), list(folder.rglob("*"))
    handle.remove()
    assert all(p.device.type == "meta" for p in host.deep.parameters())
    if tier == "disk":  # the control: converted groups (a LoRA would be) are written
        index = CheckpointIndex.open(files[1], "te")
        weights = CheckpointWeights(index, deep_keys, "", lambda n, t: t, lambda n: True)
        handle = apply_offload(host, policy, onload_device="cpu", weights=weights)
        assert len(list(folder.rglob("group-*"))) == 4
        assert torch.equal(run(host), expected)
        handle.remove()


def _read_small(host: Host, path: Path, keys: dict[str, str]) -> None:
    """The small file read whole into its encoder (the node reads files beside the streamed
    one so): keys relative to the encoder."""
    rel = {k.removeprefix("small."): v for k, v in keys.items()}
    weights = CheckpointWeights(CheckpointIndex.open(path, "te"), rel)
    weights.materialize(host.small, "cpu")
