"""Speed as a ratio taken in pairs: one process holds the resident model and each mode's
offloaded copy (peers too), and runs their forwards alternately (resident, mode A, mode B,
resident, ...),
so a machine that drifts (a shared host: +-10 % between minutes here) moves both sides of
each ratio alike. compare.py gives the full table (one process per mode, for clean memory
peaks); this gives the x-resident figure a target is judged on.

    bash bench/run.sh --paired --model flux --tokens 1024 --txt-tokens 256 --rounds 4 \\
        --modes ferry-block-disk,ferry-block-disk+copy

Disk modes run from a cold page cache, as in compare.py: their files are dropped before
each of their forwards. Every output is compared with the resident one (torch.equal).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench import models, modes, probes


def run(
    spec: models.ModelSpec,
    inp: models.InputSpec,
    mode_names: list[str],
    rounds: int,
    workdir: Path,
    device: torch.device,
    echo: Any = print,
) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    ckpt = workdir / "paired-model.safetensors"
    echo(f"building {spec.label} ...")
    built = models.build_model(spec)
    models.save_checkpoint(built, ckpt)
    x = models.to_device(models.make_inputs(spec, inp, built), device)
    del built
    resident = models.load_model(spec, ckpt)
    modes.apply_mode("resident", resident, device, workdir, ckpt, {})
    applied = {}
    copies = {}
    for name in mode_names:
        m = models.load_model(spec, ckpt)
        applied[name] = modes.apply_mode(name, m, device, workdir, ckpt, {})
        copies[name] = m
    times: dict[str, list[float]] = {n: [] for n in ["resident", *mode_names]}
    equal: dict[str, bool] = dict.fromkeys(mode_names, True)
    with torch.no_grad():
        ref = models.forward(resident, x)
        for name in mode_names:  # warm-up: Ferry traces its order
            equal[name] &= torch.equal(models.forward(copies[name], x), ref)
        for r in range(rounds):
            for name in ["resident", *mode_names]:
                model = resident if name == "resident" else copies[name]
                files = [] if name == "resident" else applied[name].files
                if files:
                    probes.drop_page_cache(files)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                out = models.forward(model, x)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                times[name].append(time.perf_counter() - t0)
                if name != "resident":
                    equal[name] &= torch.equal(out, ref)
            echo(
                f"  round {r + 1}/{rounds}: "
                + ", ".join(f"{n} {times[n][-1]:.3f} s" for n in times)
            )
    for a in applied.values():
        if a.cleanup is not None:
            a.cleanup()
    rows = []
    for name in mode_names:
        ratios = [t / base for t, base in zip(times[name], times["resident"])]
        rows.append(
            {
                "mode": name,
                "median_s": statistics.median(times[name]),
                "median_ratio": statistics.median(ratios),
                "min_ratio": min(ratios),
                "max_ratio": max(ratios),
                "equal": equal[name],
            }
        )
    peers = [n for n in mode_names if not n.startswith("ferry-")]
    for row in rows:
        if row["mode"].startswith("ferry-") and peers:
            # Per round: the faster peer's time over this mode's, then the median.
            best = [min(times[p][r] for p in peers) for r in range(rounds)]
            row["x_faster_than_peers"] = statistics.median(
                b / t for b, t in zip(best, times[row["mode"]])
            )
    return {"resident_median_s": statistics.median(times["resident"]), "rows": rows}


def table(result: dict[str, Any], rounds: int) -> str:
    lines = [
        f"| mode | median s/forward | x resident, median of {rounds} rounds | range | "
        "x faster than the faster peer, median | equal |",
        "|---|---|---|---|---|---|",
        f"| resident | {result['resident_median_s']:.3f} | 1.00 | - | - | - |",
    ]
    for r in result["rows"]:
        faster = r.get("x_faster_than_peers")
        lines.append(
            f"| {r['mode']} | {r['median_s']:.3f} | {r['median_ratio']:.3f} | "
            f"{r['min_ratio']:.3f}-{r['max_ratio']:.3f} | "
            f"{'-' if faster is None else f'{faster:.2f}'} | {'yes' if r['equal'] else 'NO'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["flux", "dit"], default="flux")
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--txt-tokens", type=int, default=None)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--single-layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--size-gb", type=float, default=1.0)
    p.add_argument("--dtype", choices=sorted(models.DTYPES), default="fp32")
    p.add_argument("--modes", default="ferry-block-disk")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--device", default=None)
    p.add_argument("--workdir", default="/tmp/ferry-bench-paired")
    p.add_argument("--out", default=None, help="also write the table (markdown) here")
    a = p.parse_args(argv)
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    names = [m for m in a.modes.split(",") if m]
    bad = [m for m in names if m == "resident" or not modes.valid(m, device.type)]
    if bad:
        p.error(f"unknown mode(s) {bad}; see python -m bench.compare --help")
    if a.rounds < 1:
        p.error("--rounds must be >= 1")
    spec = models.ModelSpec(a.model, a.dtype, a.layers, a.single_layers, a.heads, size_gb=a.size_gb)
    txt = a.txt_tokens if a.txt_tokens is not None else max(a.tokens // 4, 1)
    inp = models.InputSpec(a.tokens, txt)
    result = run(spec, inp, names, a.rounds, Path(a.workdir), device)
    text = (
        f"{spec.label}; {a.tokens} image + {txt} text tokens; onload {device}; "
        f"{a.rounds} rounds, forwards alternating in one process.\n\n" + table(result, a.rounds)
    )
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 0 if all(r["equal"] for r in result["rows"] if r["mode"].startswith("ferry-")) else 1


if __name__ == "__main__":
    raise SystemExit(main())
