"""The processes of test_stream_memory: write a checkpoint, run it resident, run it through
load_offloaded (the last one inside a memory cgroup). ``python stream_memory_worker.py MODE
ARCH CHECKPOINT OUT [DISK [PRESET]]``; results go to OUT (a .pt with the output and a .json).
MODE ``quantized`` is load_quantized's resident model (the reference for a PRESET)."""

from __future__ import annotations

import json
import math
import sys

import torch
from torch import nn

from offload_core import BlockLevel, DiskTier, OffloadPolicy
from offload_core.formats.safetensors import read_header, write_file
from offload_core.loader import load_offloaded
from offload_core.model.demo import DemoDiT, _shape_for, demo_inputs
from offload_core.runtime.memory import PeakRssSampler, process_memory

GB = 1e9
#: Each file is about 1.3 GB: at least twice the test's 600 MiB limit.
FILE_GB = 1.3


class Encoder(nn.Module):
    """A second architecture: token embedding + torch's own TransformerEncoderLayers."""

    def __init__(self, dim: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, dim)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, 8, 4 * dim, batch_first=True, dropout=0.0)
            for _ in range(layers)
        )
        self.head = nn.Linear(dim, 1000)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


#: dit-q, quantized to int8 as it streams: 0.8 G weights, so the quantized model alone
#: (0.8 GB) is more than the test's limit; only a group-by-group quantization fits.
QUANT_GB = 1.6


def build(arch: str) -> nn.Module:
    """The network in float32 (the file may be narrower: the loader casts); dit-q in bfloat16."""
    if arch == "dit":
        dim, n_double, n_single = _shape_for(FILE_GB, torch.float32)
        return DemoDiT(dim, max(dim // 64, 1), n_double, n_single).eval().requires_grad_(False)
    if arch == "dit-q":
        dim, n_double, n_single = _shape_for(QUANT_GB, torch.bfloat16)
        dit = DemoDiT(dim, max(dim // 64, 1), n_double, n_single).to(torch.bfloat16)
        return dit.eval().requires_grad_(False)
    dim = 1024
    layers = round(FILE_GB * GB / 2 / (12 * dim * dim))  # stored as bfloat16
    return Encoder(dim, layers).eval().requires_grad_(False)


FILE_DTYPE = {"dit": torch.float32, "dit-q": torch.bfloat16, "encoder": torch.bfloat16}


def inputs(arch: str, model: nn.Module) -> dict[str, torch.Tensor]:
    if arch == "dit":
        return demo_inputs(model, tokens=64)  # type: ignore[arg-type]
    if arch == "dit-q":
        x = demo_inputs(model, tokens=64)  # type: ignore[arg-type]
        return {k: v.to(torch.bfloat16) for k, v in x.items()}
    gen = torch.Generator().manual_seed(0)
    return {"tokens": torch.randint(0, 1000, (1, 64), generator=gen)}


def write(arch: str, path: str) -> None:
    """Random weights written one tensor at a time (the model is built on meta)."""
    with torch.device("meta"):
        model = build(arch)
    sd = model.state_dict()
    dtype = FILE_DTYPE[arch]
    gen = torch.Generator().manual_seed(1)

    def tensors():  # type: ignore[no-untyped-def]
        for k, t in sd.items():
            scale = 1.0 / math.sqrt(t.shape[-1])
            yield k, (torch.randn(t.shape, generator=gen) * scale).to(dtype)

    with open(path, "wb") as f:
        write_file(f, [(k, dtype, tuple(t.shape)) for k, t in sd.items()], {}, tensors())


def resident(arch: str, path: str) -> tuple[torch.Tensor, dict[str, float]]:
    from safetensors.torch import load_file

    model = build(arch)
    model.load_state_dict(load_file(path))
    with torch.no_grad():
        return model(**inputs(arch, model)), {}


def quantized(arch: str, path: str, preset: str) -> tuple[torch.Tensor, dict[str, float]]:
    from offload_core.quant import load_quantized

    model, _ = load_quantized(path, lambda dev: build(arch), preset)
    with torch.no_grad():
        return model(**inputs(arch, model)), {}


def ferry(
    arch: str, path: str, disk: str, preset: str | None
) -> tuple[torch.Tensor, dict[str, float]]:
    if preset is not None:
        import torchao  # noqa: F401  (its import is not the load's: counted in the start)
    start = process_memory().rss_anon
    sampler = PeakRssSampler().start()
    policy = OffloadPolicy(level=BlockLevel(1), tier=DiskTier(disk), prefetch_depth=1)
    handle = load_offloaded(
        path, lambda dev: build(arch), policy, onload_device="cpu", quantize=preset
    )
    model = handle.model
    load_peak = sampler.peak.rss_anon
    with torch.no_grad():
        out = model(**inputs(arch, model))
    peak = sampler.stop()
    plan = handle.plan
    placement = handle._placement
    written = len(placement.store.written) if placement.store else 0
    info = {
        "start_rss_anon": start,
        "load_peak_rss_anon": load_peak,
        "peak_rss_anon": peak.rss_anon,
        "peak_rss_file": peak.rss_file,
        "outside_bytes": plan.outside_bytes,
        "largest_group": plan.slot_bytes,
        "prefetch_depth": plan.prefetch_depth,
        "file_bytes": read_header(path).file_size,
        "group_files_written": written,
        "groups": len(plan.groups),
        # A weight-only int8 matmul dequantizes one weight to the model's dtype at a time.
        "largest_weight": max(
            m.weight.numel() * m.weight.element_size()
            for m in model.modules()
            if isinstance(m, nn.Linear)
        ),
    }
    handle.remove()
    return out, info


def main() -> None:
    mode, arch, path, out = sys.argv[1:5]
    if mode == "write":
        write(arch, path)
        return
    if mode == "resident":
        y, info = resident(arch, path)
    elif mode == "quantized":
        y, info = quantized(arch, path, sys.argv[5])
    else:
        y, info = ferry(arch, path, sys.argv[5], sys.argv[6] if len(sys.argv) > 6 else None)
    torch.save(y, out + ".pt")
    with open(out + ".json", "w") as f:
        json.dump(info, f)


if __name__ == "__main__":
    main()
