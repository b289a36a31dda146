"""Speed as a ratio taken in pairs: one process holds the resident model and each mode's
offloaded copy (peers too), and runs their forwards alternately (resident, mode A, mode B,
resident, ...),
so a machine that drifts (a shared host: +-10 % between minutes here) moves both sides of
each ratio alike. compare.py gives the full table (one process per mode, for clean memory
peaks); this gives the x-resident figure a target is judged on.

    bash bench/run.sh --paired --model flux --tokens 1024 --txt-tokens 256 --rounds 4 \\
        --modes ferry-block-disk,ferry-block-disk+mapped

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

from bench import harness, models, modes, probes, report
from offload_core.units import GB


def run(
    spec: models.ModelSpec,
    inp: models.InputSpec,
    mode_names: list[str],
    rounds: int,
    workdir: Path,
    device: torch.device,
    echo: Any = print,
) -> dict[str, Any]:
    echo(f"building {spec.label} ...")
    prep = harness.prepare(spec, workdir / "paired-model.safetensors", inp)
    ckpt, x = prep.checkpoint, models.to_device(prep.inputs, device)
    resident = models.load_model(spec, ckpt)
    modes.apply_mode("resident", resident, device, workdir, ckpt, {})
    applied = {}
    copies = {}
    for name in mode_names:
        m = models.load_model(spec, ckpt)
        applied[name] = modes.apply_mode(name, m, device, workdir, ckpt, {})
        copies[name] = m
    raw_files = next((applied[n].files for n in mode_names if applied[n].files), [])
    times: dict[str, list[float]] = {n: [] for n in ["resident", *mode_names]}
    raw: list[tuple[float, int]] = []  # the raw cold read of the same files, per round
    in_read: dict[str, list[float]] = {n: [] for n in mode_names}  # GB/s while reading
    # Per round, as fractions of the forward: the time any read was in flight (the reader
    # busy), and the time compute waited for a group (stalled).
    busy: dict[str, list[tuple[float, float]]] = {n: [] for n in mode_names}
    equal: dict[str, bool] = dict.fromkeys(mode_names, True)
    with torch.no_grad():
        ref = models.forward(resident, x)
        for name in mode_names:  # warm-up: Ferry traces its order
            equal[name] &= torch.equal(models.forward(copies[name], x), ref)
        for r in range(rounds):
            for name in ["resident", *mode_names]:
                model = resident if name == "resident" else copies[name]
                a = applied.get(name)
                before = a.stats() if a is not None and a.stats is not None else None
                out, seconds = _timed_forward(model, x, a.files if a else [], device)
                times[name].append(seconds)
                if before is not None and a is not None and a.stats is not None:
                    after = a.stats()
                    disk_s = after["disk_s"] - before["disk_s"]
                    got = after["bytes_disk"] - before["bytes_disk"]
                    in_read[name].append(got / disk_s / GB if disk_s > 0 else 0.0)
                    stalled = after["stall_s"] - before["stall_s"]
                    busy[name].append((disk_s / seconds, stalled / seconds))
                if name != "resident":
                    equal[name] &= torch.equal(out, ref)
            if raw_files:
                raw.append(probes.raw_read(raw_files))
            echo(
                f"  round {r + 1}/{rounds}: "
                + ", ".join(f"{n} {times[n][-1]:.3f} s" for n in times)
                + (f", raw read {raw[-1][0]:.3f} s" if raw else "")
            )
    for a in applied.values():
        if a.cleanup is not None:
            a.cleanup()
    result = _summary(times, raw, in_read, equal, mode_names, rounds)
    for row in result["rows"]:
        if busy[row["mode"]]:
            row["reading"] = statistics.median(b for b, _ in busy[row["mode"]])
            row["stalled"] = statistics.median(st for _, st in busy[row["mode"]])
    return result


def _timed_forward(
    model: Any, x: Any, files: list[Path], device: torch.device
) -> tuple[torch.Tensor, float]:
    if files:
        probes.drop_page_cache(files)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    out = models.forward(model, x)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - t0


def _summary(
    times: dict[str, list[float]],
    raw: list[tuple[float, int]],
    in_read: dict[str, list[float]],
    equal: dict[str, bool],
    mode_names: list[str],
    rounds: int,
) -> dict[str, Any]:
    # The limit, per round: a forward can be no faster than its compute (resident) nor than
    # reading every weight once from the disk (the raw cold read of the same files).
    limit = [max(t, rs) for t, (rs, _) in zip(times["resident"], raw)] if raw else []
    raw_gbps = [n / rs / GB for rs, n in raw]
    rows = []
    for name in mode_names:
        ratios = [t / base for t, base in zip(times[name], times["resident"])]
        row: dict[str, Any] = {
            "mode": name,
            "median_s": statistics.median(times[name]),
            "median_ratio": statistics.median(ratios),
            "min_ratio": min(ratios),
            "max_ratio": max(ratios),
            "equal": equal[name],
        }
        if limit:
            row["x_limit"] = statistics.median(t / lim for t, lim in zip(times[name], limit))
        rates = in_read.get(name) or []
        if rates and any(rates) and raw_gbps:
            row["in_read_gbps"] = statistics.median(rates)
            row["in_read_x_raw"] = statistics.median(a / b for a, b in zip(rates, raw_gbps))
        rows.append(row)
    peers = [n for n in mode_names if not n.startswith("ferry-")]
    for row in rows:
        if row["mode"].startswith("ferry-") and peers:
            # Per round: the faster peer's time over this mode's, then the median.
            best = [min(times[p][r] for p in peers) for r in range(rounds)]
            row["x_faster_than_peers"] = statistics.median(
                b / t for b, t in zip(best, times[row["mode"]])
            )
    out: dict[str, Any] = {"resident_median_s": statistics.median(times["resident"]), "rows": rows}
    if raw:
        out["raw_median_s"] = statistics.median(rs for rs, _ in raw)
        out["raw_gbps"] = statistics.median(raw_gbps)
        out["limit_x_resident"] = statistics.median(
            lim / t for lim, t in zip(limit, times["resident"])
        )
    return out


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
    bad = [m for m in names if m == "resident" or not modes.valid(m)]
    if bad:
        p.error(f"unknown mode(s) {bad}; see python -m bench.compare --help")
    if a.rounds < 1:
        p.error("--rounds must be >= 1")
    spec = models.ModelSpec(a.model, a.dtype, a.layers, a.single_layers, a.heads, size_gb=a.size_gb)
    txt = a.txt_tokens if a.txt_tokens is not None else max(a.tokens // 4, 1)
    inp = models.InputSpec(a.tokens, txt)
    result = run(spec, inp, names, a.rounds, Path(a.workdir).resolve(), device)
    text = (
        f"{spec.label}; {a.tokens} image + {txt} text tokens; onload {device}; "
        f"{a.rounds} rounds, forwards alternating in one process.\n\n"
        + report.paired_table(result, a.rounds)
    )
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 0 if all(r["equal"] for r in result["rows"] if r["mode"].startswith("ferry-")) else 1


if __name__ == "__main__":
    raise SystemExit(main())
