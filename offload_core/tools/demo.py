"""The CLI demo: build a synthetic DiT, run it resident, then offloaded, and print a table.

    python -m offload_core.tools.demo                       # ~2 GiB bf16 model, pinned RAM, auto device
    python -m offload_core.tools.demo --tier disk --disk-path /nvme/ferry --size-gb 8
    python -m offload_core.tools.demo --level leaf --tier ram --device cpu --size-gb 0.5

Every offloaded output is checked against the resident output with torch.equal.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..api import apply_offload
from ..errors import FerryError
from ..model.demo import build_demo_model, demo_inputs
from ..model.plan import resolve_device
from ..policy import OffloadPolicy
from ..runtime.memory import PeakRssSampler, ProcessMemory, device_memory
from ..units import GB, fmt_bytes

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class Row:
    mode: str
    seconds: float
    peak_vram: int | None
    peak_ram: ProcessMemory
    h2d: int = 0
    disk: int = 0
    gbps: float | None = None
    stall_s: float = 0.0
    overlap: float | None = None
    equal: bool | None = None


def _sync(device: torch.device) -> None:
    if device.type != "cpu":
        torch.accelerator.synchronize()


def _timed(
    model: torch.nn.Module, x: dict[str, torch.Tensor], n: int, device: torch.device
) -> tuple[float, torch.Tensor]:
    out = None
    with torch.no_grad():
        out = model(**x)  # warm-up (and, offloaded, the traced forward)
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(n):
            out = model(**x)
        _sync(device)
    return (time.perf_counter() - t0) / n, out


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def run_demo(args: argparse.Namespace, echo: Callable[[str], Any] = print) -> list[Row]:
    device = resolve_device(args.device)
    policy = _policy_from_args(args)
    model, x = _build(args, device, echo)
    resident, ref = _run_resident(model, x, args.forwards, device)
    offloaded = _run_offloaded(model, x, policy, args.forwards, device, echo, ref)
    rows = [resident, offloaded]
    echo(format_table(rows, resident.seconds, args.forwards + 1))
    return rows


def _policy_from_args(args: argparse.Namespace) -> OffloadPolicy:
    return OffloadPolicy.from_dict(
        {
            "level": args.level,
            "blocks_per_group": args.blocks_per_group,
            "tier": args.tier,
            "disk_path": args.disk_path,
            "prefetch_depth": args.prefetch,
            "vram_budget_gb": args.vram_budget_gb,
        }
    )


def _build(
    args: argparse.Namespace, device: torch.device, echo: Callable[[str], Any]
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The demo DiT (quantized if asked) and one forward's inputs on ``device``."""
    tokens = args.tokens or (1024 if device.type != "cpu" else 64)
    echo(f"building a {args.size_gb:g} GiB {args.dtype} demo DiT (seed {args.seed}) ...")
    model = build_demo_model(args.size_gb, DTYPES[args.dtype], seed=args.seed)
    if args.quant and args.quant != "none":
        from ..quant import quantize_model

        echo(f"quantizing with {args.quant} ...")
        quantize_model(model, args.quant, device=device)
    n_params = sum(p.numel() for p in model.parameters())
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    echo(
        f"model: {n_params / 1e6:.0f} M parameters ({fmt_bytes(weights)}), "
        f"{len(model.double_blocks)} double + "
        f"{len(model.single_blocks)} single blocks; {tokens} image tokens; device {device}"
    )
    return model, demo_inputs(model, tokens=tokens, seed=args.seed, device=device)


def _run_resident(
    model: torch.nn.Module, x: dict[str, Any], forwards: int, device: torch.device
) -> tuple[Row, torch.Tensor]:
    """The whole model on the device: the speed to match and the output to equal."""
    model.to(device)
    _reset_peak(device)
    with PeakRssSampler() as rss:
        t_res, ref = _timed(model, x, forwards, device)
    dm = device_memory(device)
    row = Row("resident", t_res, dm.peak_allocated if dm else None, rss.peak)
    ref = ref.detach().clone()
    model.to("cpu")
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row, ref


def _run_offloaded(
    model: torch.nn.Module,
    x: dict[str, Any],
    policy: OffloadPolicy,
    forwards: int,
    device: torch.device,
    echo: Callable[[str], Any],
    ref: torch.Tensor,
) -> Row:
    echo("offloading ...")
    handle = apply_offload(model, policy, onload_device=device, name="demo", progress=_progress())
    echo(handle.plan.describe())
    try:
        _reset_peak(device)
        with PeakRssSampler() as rss:
            t_off, out = _timed(model, x, forwards, device)
        st = handle.stats()
    finally:
        handle.remove()
    moved_s = st.transfer_s
    rate = (st.bytes_h2d + st.bytes_disk) / moved_s / GB if moved_s > 0 else None
    return Row(
        f"ferry {policy.level_name}/{policy.tier_name}", t_off, st.peak_vram, rss.peak,
        st.bytes_h2d, st.bytes_disk, rate, st.stall_s, st.overlap, bool(torch.equal(out, ref)),
    )  # fmt: skip


def _progress() -> Callable[[int, int], None]:
    from tqdm import tqdm

    bar: dict[str, Any] = {}

    def update(done: int, total: int) -> None:
        if "bar" not in bar:
            bar["bar"] = tqdm(total=total, desc="laying out groups", unit="group", leave=False)
        bar["bar"].update(done - bar["bar"].n)
        if done == total:
            bar["bar"].close()

    return update


def format_table(rows: list[Row], baseline: float, forwards: int) -> str:
    head = (
        "mode", "s/forward", "x resident", "peak VRAM", "RssAnon", "RssFile", "RssShmem",
        "H2D moved", "disk read", "GB/s", "stall s", "overlap", "equal",
    )  # fmt: skip
    body = []
    for r in rows:
        body.append(
            (
                r.mode,
                f"{r.seconds:.3f}",
                f"{r.seconds / baseline:.2f}",
                fmt_bytes(r.peak_vram),
                fmt_bytes(r.peak_ram.rss_anon),
                fmt_bytes(r.peak_ram.rss_file),
                fmt_bytes(r.peak_ram.rss_shmem),
                fmt_bytes(r.h2d) if r.h2d else "-",
                fmt_bytes(r.disk) if r.disk else "-",
                f"{r.gbps:.2f}" if r.gbps else "-",
                f"{r.stall_s:.3f}" if r.mode != "resident" else "-",
                f"{r.overlap:.0%}" if r.overlap is not None else "-",
                "-" if r.equal is None else ("yes" if r.equal else "NO"),
            )
        )
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    note = f"(bytes moved and stall summed over {forwards} forwards incl. warm-up; equal = torch.equal to resident)"
    return "\n".join([line(head), sep, *map(line, body), note])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m offload_core.tools.demo", description=__doc__.split("\n")[0]
    )
    p.add_argument("--size-gb", type=float, default=2.0, help="model size in GiB (default 2)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--level", choices=["block", "leaf"], default="block")
    p.add_argument("--blocks-per-group", type=int, default=1)
    p.add_argument("--tier", choices=["pinned", "ram", "disk"], default="pinned")
    p.add_argument("--disk-path", default="./ferry_offload", help="folder for the disk tier")
    p.add_argument("--prefetch", type=int, default=1, help="groups loaded ahead (1..8)")
    p.add_argument(
        "--vram-budget-gb", default=None, help="'auto' or GiB; default: stream everything"
    )
    p.add_argument(
        "--device", default=None, help="onload device (default: the accelerator, else cpu)"
    )
    p.add_argument(
        "--tokens", type=int, default=None, help="image tokens (default 1024 on GPU, 64 on CPU)"
    )
    p.add_argument("--forwards", type=int, default=3, help="timed forwards after a warm-up")
    p.add_argument("--quant", default="none", help="quantization preset (see offload_core.quant)")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        rows = run_demo(args)
    except FerryError as e:
        print(f"ferry: {e}", file=sys.stderr)
        return 2
    return 0 if all(r.equal is not False for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
