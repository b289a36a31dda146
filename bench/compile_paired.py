"""torch.compile with and without Ferry, in pairs: step time compiled against eager, resident
and offloaded, and the first step's compile time.

One process holds four copies of the same demo DiT (same seed): eager resident, compiled
resident, eager offloaded, compiled offloaded (Ferry, block level, the tier asked for); each
round runs one forward of each in turn, so a drifting machine moves every ratio alike. The
compiled copies compile their repeated blocks (offload_core's CompiledBlocks, what Ferry's
nodes do with core's TorchCompileModel). Before the rounds, each compiled copy's first
forward is timed from a reset dynamo with inductor's on-disk caches off (``--warm-cache``
keeps them): that is the compile a user waits for. Every compiled offloaded output is
compared with the compiled resident one (torch.equal), every eager offloaded one with the
eager resident one.

    .venv/bin/python -m bench.compile_paired --size-gb 0.1 --tokens 256 --rounds 5
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bench import harness, report
from offload_core import (
    BlockLevel,
    CompiledBlocks,
    CompileSettings,
    DiskTier,
    OffloadPolicy,
    PinnedRamTier,
    RamTier,
    apply_offload,
)
from offload_core.model.demo import build_demo_model, demo_inputs
from offload_core.units import GIB, fmt_bytes

MODES = ("eager resident", "compiled resident", "eager Ferry", "compiled Ferry")


def _forward(model: nn.Module, x: dict[str, torch.Tensor]) -> tuple[torch.Tensor, float]:
    t = time.perf_counter()
    with torch.no_grad():
        out = model(**x)
    if out.is_cuda:
        torch.cuda.synchronize()
    return out, time.perf_counter() - t


def _first_compiled_step(model: nn.Module, x: dict[str, torch.Tensor]) -> float:
    """Seconds of the first forward after a dynamo reset: tracing plus inductor's codegen."""
    torch._dynamo.reset()
    return _forward(model, x)[1]


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    base = build_demo_model(args.size_gb, dtype, seed=7)
    device = torch.device(args.device)
    x = demo_inputs(base, tokens=args.tokens, seed=3, device=device)
    models = {m: copy.deepcopy(base) for m in MODES}
    for m in ("eager resident", "compiled resident"):
        models[m].to(device)
    settings = CompileSettings(backend="inductor")
    for m in ("compiled resident", "compiled Ferry"):
        CompiledBlocks(models[m], settings).apply()
    tiers = {"pinned": PinnedRamTier(), "ram": RamTier()}
    tier = tiers.get(args.tier) or DiskTier(str(workdir), cpu_read=args.cpu_read)
    policy = OffloadPolicy(level=BlockLevel(args.blocks_per_group), tier=tier)
    handles = [
        apply_offload(models[m], policy, onload_device=device) for m in MODES if "Ferry" in m
    ]
    if not args.warm_cache:
        torch._inductor.config.force_disable_caches = True
    # Inductor's one-time start in a process (its imports, the C++ toolchain probe) is paid by
    # a throwaway function first, so neither row's first step carries it.
    torch.compile(lambda t: torch.sin(t) + 1)(torch.ones(8))
    first = {m: _first_compiled_step(models[m], x) for m in ("compiled resident", "compiled Ferry")}
    torch._inductor.config.force_disable_caches = False
    times: dict[str, list[float]] = {m: [] for m in MODES}
    equal = {"eager Ferry": True, "compiled Ferry": True}
    for r in range(args.rounds):
        outs = {}
        for m in MODES:
            outs[m], seconds = _forward(models[m], x)
            times[m].append(seconds)
        equal["eager Ferry"] &= torch.equal(outs["eager Ferry"], outs["eager resident"])
        equal["compiled Ferry"] &= torch.equal(outs["compiled Ferry"], outs["compiled resident"])
        print(f"  round {r + 1}/{args.rounds}: " + ", ".join(
            f"{m} {times[m][-1] * 1e3:.0f} ms" for m in MODES))  # fmt: skip
    stats = handles[0].stats()
    for h in handles:
        h.remove()
    return {"times": times, "first": first, "equal": equal, "groups": stats.groups}


def table(result: dict[str, Any]) -> str:
    """Ratios two ways: of the medians, and of the best (fastest) forwards, the figure least
    disturbed by a shared machine (the other processes only ever add time)."""
    times = result["times"]
    med = {m: report.median_range(v)[0] for m, v in times.items()}
    best = {m: min(v) for m, v in times.items()}
    rows = []
    for m in MODES:
        mid, lo, hi = report.median_range(times[m])
        eager = "eager resident" if "resident" in m else "eager Ferry"
        out = result["equal"].get(m)
        rows.append([
            m,
            f"{mid * 1e3:.0f} ({lo * 1e3:.0f}-{hi * 1e3:.0f})",
            f"{med[eager] / med[m]:.2f}x / {best[eager] / best[m]:.2f}x",
            f"{med['eager resident'] / med[m]:.2f}x / {best['eager resident'] / best[m]:.2f}x",
            f"{result['first'][m]:.1f}" if m in result["first"] else "-",
            "(reference)" if out is None else ("equal" if out else "DIFFERS"),
        ])  # fmt: skip
    head = [
        "mode",
        "ms / step: median (min-max)",
        "speed vs its eager: median / best",
        "speed vs eager resident: median / best",
        "first step s (compile)",
        "output",
    ]
    return report.md_table(head, rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--size-gb",
        type=float,
        default=0.1,
        help="demo DiT weights in the demo factory's decimal unit (0.1: about 0.09 GiB)",
    )
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--tokens", type=int, default=256, help="image tokens per forward")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--device", default="cpu", help="cpu, or cuda (the GPU suite's row)")
    p.add_argument("--tier", choices=["pinned", "ram", "disk"], default="ram")
    p.add_argument("--cpu-read", choices=["copy", "mapped"], default="copy",
                   help="the disk tier's CPU read (copy: into slots, as a GPU does)")  # fmt: skip
    p.add_argument("--blocks-per-group", type=int, default=1)
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads (0: torch's default); 1 steadies a shared machine")  # fmt: skip
    p.add_argument("--warm-cache", action="store_true",
                   help="keep inductor's on-disk caches for the first step")  # fmt: skip
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="ferry-compile-bench-") as d:
        m = harness.machine(Path(d))
        result = run(args, Path(d))
        load_end = os.getloadavg()
    print()
    print(report.machine_line(m, threads=True))
    print(
        f"demo DiT of about {fmt_bytes(args.size_gb * GIB)} {args.dtype} on {args.device}, {args.tokens} tokens, {result['groups']} "
        f"groups, Ferry block level x{args.blocks_per_group}, tier {args.tier}"
        f"{' (' + args.cpu_read + ')' if args.tier == 'disk' else ''}, {args.rounds} rounds, "
        f"inductor caches {'warm' if args.warm_cache else 'off'} for the first step; load "
        f"average {m['load'][0]:.1f} at the start, {load_end[0]:.1f} at the end"
    )
    print()
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
