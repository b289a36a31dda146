"""Quantization loader benchmark: one row per preset.

    python bench/bench_quant.py --size-gb 0.25 [--dtype bf16] [--device cpu] [--tier disk]

Per preset: load time cold (read the checkpoint and quantize, writing the cache) and warm
(read the cache), bytes on disk, forward time resident and offloaded (apply_offload with
--tier/--level), and the output's relative error against the full-precision model. The demo
model (offload_core.model.demo) is written to a temporary checkpoint first. torchao is imported
and each preset run once on a tiny layer before any timing (one-time costs, reported apart). The page cache of the file a load reads
is dropped before it (posix_fadvise DONTNEED) unless --keep-page-cache.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import probes
from bench.report import md_table
from offload_core import (
    BlockLevel,
    DiskTier,
    LeafLevel,
    OffloadPolicy,
    PinnedRamTier,
    RamTier,
    apply_offload,
)
from offload_core.formats.safetensors import read_header
from offload_core.model.builders import demo_build
from offload_core.model.demo import build_demo_model, demo_inputs
from offload_core.quant import load_quantized, presets_for_device, quantize_model
from offload_core.units import GIB, MIB, fmt_bytes

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def drop_page_cache(path: str | None) -> None:
    """Evicts a file's clean pages so the next read comes from the disk."""
    if path is None or not hasattr(os, "posix_fadvise"):
        return
    probes.drop_page_cache([Path(path)])


def forward_seconds(
    model: torch.nn.Module, x: dict[str, torch.Tensor], runs: int
) -> tuple[float, torch.Tensor]:
    with torch.no_grad():
        out = model(**x)  # warm-up (and the output compared)
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            model(**x)
            if out.device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
    return statistics.median(times), out


def warm_up(presets: list[str], device: str) -> float:
    """First-call costs (torchao's op registration, kernel selection) paid once per process,
    before anything is timed."""
    t = time.perf_counter()
    for preset in presets:
        model = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(256, 256)])).to(device)
        quantize_model(model, preset)
        with torch.no_grad():
            model[0][0](torch.randn(4, 256, device=device))
    return time.perf_counter() - t


def rel_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref.float()).norm() / ref.float().norm())


def _num(v: float | None, digits: int) -> str:
    return f"{v:.{digits}f}" if v is not None else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--size-gb", type=float, default=0.25,
        help="demo model size in the demo factory's decimal unit (0.25: about 0.23 GiB)",
    )  # fmt: skip
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--presets", nargs="*", default=None, help="default: every preset the device runs"
    )
    ap.add_argument("--tier", choices=["pinned", "ram", "disk"], default="disk")
    ap.add_argument("--level", choices=["block", "leaf"], default="block")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep-page-cache", action="store_true")
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args(argv)

    t = time.perf_counter()
    import torchao  # noqa: F401  (a one-time import, kept out of the load times)

    import_s = time.perf_counter() - t
    presets = args.presets or presets_for_device(args.device)
    warm_up_s = warm_up(presets, args.device)
    work = Path(tempfile.mkdtemp(prefix="ferry-bench-quant-"))
    ckpt = work / "demo.safetensors"
    full = build_demo_model(size_gb=args.size_gb, dtype=DTYPES[args.dtype], seed=0)
    save_file(full.state_dict(), str(ckpt))
    del full
    build = demo_build(read_header(ckpt))
    rows: list[dict[str, Any]] = []
    reference: torch.Tensor | None = None
    print(
        f"demo model of about {fmt_bytes(args.size_gb * GIB)} {args.dtype}, checkpoint {fmt_bytes(ckpt.stat().st_size)}, "
        f"device {args.device}, offload {args.level}/{args.tier}, tokens {args.tokens}, "
        f"torch threads {torch.get_num_threads()}, torchao import {import_s:.2f} s and "
        f"first-call warm-up {warm_up_s:.2f} s (not in the loads), page cache "
        f"{'kept' if args.keep_page_cache else 'dropped before each load'}"
    )
    for preset in presets:
        cache = work / f"cache-{preset}"
        if not args.keep_page_cache:
            drop_page_cache(str(ckpt))
        t = time.perf_counter()
        model, report = load_quantized(ckpt, build, preset, cache_dir=cache, device=args.device)
        cold = time.perf_counter() - t
        del model
        if not args.keep_page_cache:
            drop_page_cache(report.cache_path)
        t = time.perf_counter()
        model, warm_report = load_quantized(
            ckpt, build, preset, cache_dir=cache, device=args.device
        )
        warm = time.perf_counter() - t
        assert warm_report.cache == ("hit" if preset != "none" else "off"), warm_report.cache
        x = demo_inputs(model, tokens=args.tokens, device=args.device)  # type: ignore[arg-type]
        resident_s, out = forward_seconds(model, x, args.runs)
        if reference is None:
            ref_model, _ = load_quantized(ckpt, build, "none", device=args.device)
            with torch.no_grad():
                reference = ref_model(**x)
            del ref_model
        tier = {
            "pinned": PinnedRamTier(),
            "ram": RamTier(),
            "disk": DiskTier(str(work / "offload")),
        }[args.tier]
        level = BlockLevel(1) if args.level == "block" else LeafLevel()
        handle = apply_offload(
            model, OffloadPolicy(level=level, tier=tier), onload_device=args.device
        )
        try:
            offloaded_s, off_out = forward_seconds(model, x, args.runs)
        finally:
            handle.remove()
        rows.append(
            {
                "preset": preset,
                "quantized_layers": f"{len(report.quantized)}/{len(report.layers)}",
                "cold_s": cold,
                # "none" is never cached: its second load is not a cache read.
                "warm_s": warm if preset != "none" else None,
                "speedup": cold / warm if preset != "none" else None,
                # "none" is never cached: its bytes on disk are the checkpoint's.
                "disk_mib": Path(report.cache_path or ckpt).stat().st_size / MIB,
                "resident_s": resident_s,
                "offloaded_s": offloaded_s,
                "exact": bool(torch.equal(off_out, out)),
                "rel_err": rel_error(out, reference),
            }
        )
        del model
    head = (
        "preset", "layers q.", "cold load s", "warm load s", "warm x", "cache MiB",
        "fwd resident s", "fwd offloaded s", "offloaded == resident", "rel. error vs fp",
    )  # fmt: skip
    table = [
        (
            r["preset"],
            str(r["quantized_layers"]),
            f"{r['cold_s']:.2f}",
            _num(r["warm_s"], 2),
            _num(r["speedup"], 1),
            f"{r['disk_mib']:.1f}",
            f"{r['resident_s']:.3f}",
            f"{r['offloaded_s']:.3f}",
            str(r["exact"]),
            f"{r['rel_err']:.2e}",
        )
        for r in rows
    ]
    print(md_table(head, table))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
