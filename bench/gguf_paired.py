"""A GGUF Q8_0 model resident against Ferry's disk tier, as ratios taken in pairs (one
process, forwards alternating, as bench/paired.py does), from a cold page cache:

- ``ferry-disk-gguf``: the groups read straight from the .gguf (``source_checkpoint``, what
  Ferry Offload Model does behind ComfyUI-GGUF's loader), nothing written;
- ``ferry-disk-safetensors``: the same bytes read from a safetensors file of the same raw
  tensors (the safetensors ``source_checkpoint`` path);
- ``ferry-disk-written``: the groups written to Ferry's own group files (a model whose file
  Ferry does not know).

    .venv/bin/python -m bench.gguf_paired --size-gb 1 --rounds 5 --workdir /tmp/ferry-gguf

The model is a stack of blocks of two Q8_0 Linears (dequantized on every forward by a small
torch kernel, as ComfyUI-GGUF's Q8_0 kernel does: fp16 scale x int8 per 32 values). Every
output is compared with the resident one (torch.equal). CPU only: the ratio is the cost of
reading the weights from the disk while computing, against holding them in RAM.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn

from bench import probes, report
from offload_core import BlockLevel, DiskTier, OffloadPolicy, apply_offload
from offload_core.units import GIB, fmt_bytes

Q8 = gguf.GGMLQuantizationType.Q8_0
ROW_BYTES = 34  # 32 int8 values and their fp16 scale


class Q8Linear(nn.Module):
    def __init__(self, raw: torch.Tensor, out_f: int, in_f: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(raw, requires_grad=False)  # the file's bytes, as stored
        self.out_f, self.in_f = out_f, in_f

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        blocks = self.weight.view(-1, ROW_BYTES)
        scale = blocks[:, :2].contiguous().view(torch.float16).float()
        w = (scale * blocks[:, 2:].contiguous().view(torch.int8).float()).view(
            self.out_f, self.in_f
        )
        return nn.functional.linear(x, w)


class Block(nn.Module):
    def __init__(self, a: Q8Linear, b: Q8Linear) -> None:
        super().__init__()
        self.a, self.b = a, b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(nn.functional.gelu(self.a(x)))


class Net(nn.Module):
    def __init__(self, blocks: list[Block]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


def shapes(width: int, depth: int) -> dict[str, tuple[int, int]]:
    return {
        name: shape
        for i in range(depth)
        for name, shape in (
            (f"blocks.{i}.a.weight", (2 * width, width)),
            (f"blocks.{i}.b.weight", (width, 2 * width)),
        )
    }


def write_files(workdir: Path, width: int, depth: int, echo: Any) -> tuple[Path, Path]:
    """The model as a .gguf (Q8_0) and the same raw tensors as a .safetensors."""
    gpath, spath = workdir / "model-q8_0.gguf", workdir / "model-q8_0.safetensors"
    if gpath.exists() and spath.exists():
        return gpath, spath
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(gpath), arch="ferry-bench")
    raw = {}
    for i, (name, shape) in enumerate(shapes(width, depth).items()):
        q = gguf.quants.quantize((rng.standard_normal(shape) * 0.02).astype(np.float32), Q8)
        writer.add_tensor(name, q, raw_dtype=Q8)
        raw[name] = torch.from_numpy(q)
        if i % 32 == 0:
            echo(f"  writing {i}/{2 * depth} tensors")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    save_file(raw, str(spath))
    return gpath, spath


def load(gpath: Path, width: int, depth: int, copy: bool) -> Net:
    """The model over the .gguf's mapping (as ComfyUI-GGUF loads it), or copied into RAM."""
    reader = gguf.GGUFReader(str(gpath))
    data = {
        t.name: torch.from_numpy(np.array(t.data) if copy else np.asarray(t.data))
        for t in reader.tensors
    }
    sh = shapes(width, depth)

    def lin(name: str) -> Q8Linear:
        return Q8Linear(data[name], *sh[name])

    return Net(
        [Block(lin(f"blocks.{i}.a.weight"), lin(f"blocks.{i}.b.weight")) for i in range(depth)]
    )


def run(size_gb: float, width: int, tokens: int, rounds: int, workdir: Path, echo: Any) -> str:
    workdir.mkdir(parents=True, exist_ok=True)
    block_bytes = 4 * width * width // 32 * ROW_BYTES
    depth = max(2, int(size_gb * GIB // block_bytes))
    echo(f"GGUF Q8_0 net: {depth} blocks of width {width}, {fmt_bytes(depth * block_bytes)}")
    gpath, spath = write_files(workdir, width, depth, echo)
    x = torch.randn(tokens, width, generator=torch.Generator().manual_seed(1))
    models: dict[str, Net] = {"resident": load(gpath, width, depth, copy=True)}
    reads: dict[str, list[Path]] = {}
    handles = []
    for name, source in (
        ("ferry-disk-gguf", gpath),
        ("ferry-disk-safetensors", spath),
        ("ferry-disk-written", None),
    ):
        m = load(gpath, width, depth, copy=source is None)
        folder = workdir / name
        tier = DiskTier(str(folder), source_checkpoint=str(source) if source else None)
        policy = OffloadPolicy(level=BlockLevel(1), tier=tier)
        handles.append(apply_offload(m, policy, onload_device="cpu"))
        models[name] = m
        reads[name] = [source] if source else [folder]
    try:
        times, equal = _alternate(models, reads, x, rounds, echo)
    finally:
        for h in handles:
            h.remove()  # Ferry's group files deleted; the .gguf and .safetensors kept for reruns
    rows = []
    for name in models:
        ratios = [t / b for t, b in zip(times[name], times["resident"])]
        rows.append((
            name, f"{statistics.median(times[name]):.2f}", f"{statistics.median(ratios):.2f}",
            f"{min(ratios):.2f}-{max(ratios):.2f}", "yes" if equal[name] else "NO",
        ))  # fmt: skip
    head = ("mode", "median s", "x resident", "range", "equal")
    return report.md_table(head, rows)


def _alternate(
    models: dict[str, Net], reads: dict[str, list[Path]], x: torch.Tensor, rounds: int, echo: Any
) -> tuple[dict[str, list[float]], dict[str, bool]]:
    """Each round, every model's forward in turn, each disk mode from a cold page cache."""
    times: dict[str, list[float]] = {n: [] for n in models}
    equal = dict.fromkeys(models, True)
    with torch.no_grad():
        ref = models["resident"](x)
        for name, m in models.items():  # warm-up: Ferry traces its order
            equal[name] &= torch.equal(m(x), ref)
        for r in range(rounds):
            for name, m in models.items():
                probes.drop_page_cache(reads.get(name, []))
                t0 = time.perf_counter()
                out = m(x)
                times[name].append(time.perf_counter() - t0)
                equal[name] &= torch.equal(out, ref)
            echo(
                f"  round {r + 1}/{rounds}: "
                + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in models)
            )
    return times, equal


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-gb", type=float, default=1.0, help="GiB")
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workdir", type=Path, default=Path("ferry_bench_gguf"))
    a = p.parse_args(argv)
    print(run(a.size_gb, a.width, a.tokens, a.rounds, a.workdir, print))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
