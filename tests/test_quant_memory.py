"""The streaming load's RAM bound, measured on a checkpoint of more than 1 GiB.

Peak RssAnon growth during load_quantized <= quantized model + largest full-precision layer
+ 300 MB (issue 3). RssAnon, not RSS: the checkpoint's page cache is file-backed and is not
the loader's memory.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torch import nn

from offload_core.formats.safetensors import write_file
from offload_core.quant import load_quantized, quantize_model
from offload_core.runtime.memory import PeakRssSampler, process_memory

MB = 1 << 20
REPO = Path(__file__).resolve().parents[1]
DIM, BLOCKS = 2048, 6


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.fc1 = nn.Linear(DIM, 4 * DIM)
        self.fc2 = nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.qkv(h)[..., :DIM] + self.fc2(torch.nn.functional.gelu(self.fc1(h)))


class Big(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj_in = nn.Linear(DIM, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.proj_out = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj_in(x)
        for b in self.blocks:
            x = b(x)
        return self.proj_out(x)


def build(device: torch.device) -> nn.Module:
    return Big().eval().requires_grad_(False)


def _write_checkpoint(path: Path) -> None:
    """Random fp32 weights written one tensor at a time (the test itself stays small)."""
    with torch.device("meta"):
        shapes = [(k, v.dtype, tuple(v.shape)) for k, v in Big().state_dict().items()]
    gen = torch.Generator().manual_seed(0)

    def tensors():  # type: ignore[no-untyped-def]
        for key, dtype, shape in shapes:
            yield key, torch.randn(shape, generator=gen, dtype=dtype) * 0.02

    with open(path, "wb") as f:
        write_file(f, shapes, {}, tensors())


@pytest.fixture(scope="module")
def big_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("big") / "big.safetensors"
    _write_checkpoint(path)
    return path


def measure(path: str, cache: str) -> dict[str, float]:
    """Loads in THIS process and returns the peak RssAnon growth. Run in a fresh interpreter:
    memory freed by earlier tests stays in the allocator and would hide part of the peak.
    torchao is imported before the baseline: its ~80 MB of import-time memory is the
    library's, paid once per process, not the load's."""
    import torchao  # noqa: F401

    gc.collect()
    base = process_memory().rss_anon
    with PeakRssSampler(interval_s=0.002) as sampler:
        model, report = load_quantized(path, build, "int8-weight", cache_dir=cache)
    growth = sampler.peak.rss_anon - base
    x = torch.randn(2, DIM, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(x)
    torch.save(out, Path(cache) / f"out-{report.cache}.pt")
    return {
        "growth": growth,
        "quantized": report.bytes_after,
        "full": report.bytes_before,
        "largest": max(r.bytes_before for r in report.layers),
        "seconds": report.seconds,
        "cache": report.cache,  # type: ignore[dict-item]
    }


def _measure_fresh(path: Path, cache: Path) -> dict[str, float]:
    code = (
        "import json, sys; sys.path.insert(0, '.')\n"
        "from tests.test_quant_memory import measure\n"
        f"print(json.dumps(measure({str(path)!r}, {str(cache)!r})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_streaming_load_stays_within_the_memory_bound(big_checkpoint: Path, tmp_path: Path) -> None:
    assert big_checkpoint.stat().st_size > 1 << 30
    cache = tmp_path / "cache"
    cold = _measure_fresh(big_checkpoint, cache)
    bound = cold["quantized"] + cold["largest"] + 300 * MB
    print(
        f"\ncold: checkpoint {big_checkpoint.stat().st_size / MB:.0f} MiB, quantized "
        f"{cold['quantized'] / MB:.0f} MiB, largest layer {cold['largest'] / MB:.0f} MiB, "
        f"peak RssAnon growth {cold['growth'] / MB:.0f} MiB, bound {bound / MB:.0f} MiB, "
        f"{cold['seconds']:.1f} s"
    )
    assert cold["cache"] == "miss"
    assert cold["quantized"] < 0.3 * cold["full"]
    assert cold["growth"] <= bound
    assert cold["growth"] >= 0.9 * cold["quantized"]  # the sampler did see the model arrive

    warm = _measure_fresh(big_checkpoint, cache)
    print(f"warm: peak RssAnon growth {warm['growth'] / MB:.0f} MiB, {warm['seconds']:.1f} s")
    assert warm["cache"] == "hit"
    assert warm["growth"] <= warm["quantized"] + 100 * MB  # only the quantized model is read
    assert torch.equal(torch.load(cache / "out-hit.pt"), torch.load(cache / "out-miss.pt"))


def test_streamed_weights_are_the_checkpoints(big_checkpoint: Path) -> None:
    """One layer quantized straight from the file (safetensors' own reader) gives the same bits."""
    model, _ = load_quantized(big_checkpoint, build, "int8-weight")
    with safe_open(str(big_checkpoint), "pt") as f:
        ref = nn.Sequential(nn.ModuleList([nn.Linear(DIM, 4 * DIM)]))
        ref[0][0].weight = nn.Parameter(f.get_tensor("blocks.3.fc1.weight"), requires_grad=False)
        ref[0][0].bias = nn.Parameter(f.get_tensor("blocks.3.fc1.bias"), requires_grad=False)
        norm_weight = f.get_tensor("blocks.5.norm.weight")
    quantize_model(ref, "int8-weight")
    assert torch.equal(model.blocks[3].fc1.weight.qdata, ref[0][0].weight.qdata)
    assert torch.equal(model.blocks[3].fc1.weight.scale, ref[0][0].weight.scale)
    assert torch.equal(model.blocks[3].fc1.bias, ref[0][0].bias)
    assert torch.equal(model.blocks[5].norm.weight, norm_weight)
