"""Ferry side by side with diffusers group offloading and accelerate, one model, one run.

Install the peers and run it with one command (they go into .venv-bench only):

    bash bench/run.sh                        # the default suite (CPU here: ~12 minutes)
    bash bench/run.sh --suite quick          # a small smoke run
    bash bench/run.sh --model flux --tokens 256 --modes resident,ferry-block-disk,diffusers-block-disk

Each mode runs in a fresh subprocess (bench/worker.py) so peaks never mix. Per run, one
table: time per forward and ratio to resident; peak RssAnon/RssFile (sampled every 5 ms from
/proc/self/status during the timed forwards) and peak VRAM; bytes read from storage
(/proc/self/io) and copied to the device per forward; those as GB/s over the forward's time
and as a fraction of the raw disk read and pinned host-to-device bandwidth, both measured in
the same run; and whether the output equals the resident output (torch.equal). Disk modes
run from a cold page cache: every file they read is dropped (POSIX_FADV_DONTNEED) before
every timed forward, Ferry's group files included (written at apply).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from bench import harness, models, modes, probes, report
from offload_core.units import GB, fmt_bytes

CPU_MODES = [
    "resident",
    "ferry-block-ram",
    "ferry-block-disk",
    "ferry-block-disk+mapped",
    "ferry-leaf-ram",
    "ferry-leaf-disk",
    "ferry-block-disk-ckpt",
    "diffusers-block",
    "diffusers-block-disk",
    "diffusers-leaf-disk",
    "accelerate-cpu",
    "accelerate-disk",
]
GPU_MODES = [
    "resident",
    "ferry-block-pinned",
    "ferry-block-ram",
    "ferry-block-disk",
    "ferry-leaf-pinned",
    "ferry-leaf-disk",
    "diffusers-block",
    "diffusers-block-disk",
    "diffusers-leaf",
    "accelerate-cpu",
    "accelerate-disk",
]


@dataclass(frozen=True)
class Run:
    title: str
    model: models.ModelSpec
    inputs: models.InputSpec
    modes: tuple[str, ...]
    forwards: int


FLUX_CPU = models.ModelSpec("flux", "fp32", layers=4, single_layers=8, heads=12)
FLUX_GPU = models.ModelSpec("flux", "bf16", layers=6, single_layers=12, heads=24)


def suite(name: str, device: torch.device) -> list[Run]:
    gpu = device.type != "cpu"
    mset = tuple(GPU_MODES if gpu else CPU_MODES)
    if name == "quick":
        small = models.ModelSpec("flux", "fp32", layers=2, single_layers=4, heads=4)
        dit = models.ModelSpec("dit", "fp32", size_gb=0.1)
        return [
            Run("quick: small Flux", small, models.InputSpec(64, 16), mset, 2),
            Run("quick: demo DiT", dit, models.InputSpec(64, 16), mset, 2),
        ]
    if gpu:
        return [
            Run(
                "Flux, 1024x1024 image (4096 image + 512 text tokens)",
                FLUX_GPU,
                models.InputSpec(4096, 512),
                mset,
                3,
            ),
            Run(
                "Flux, 512x512 image (1024 image + 256 text tokens)",
                FLUX_GPU,
                models.InputSpec(1024, 256),
                mset,
                3,
            ),
        ]
    return [
        Run(
            "compute-heavy: Flux, 1024 image + 256 text tokens",
            FLUX_CPU,
            models.InputSpec(1024, 256),
            mset,
            2,
        ),
        Run(
            "balanced (resident compute ~ cold read of all weights): Flux, fewer tokens",
            FLUX_CPU,
            models.InputSpec(0, 0),  # tokens chosen by calibrate()
            mset,
            3,
        ),
        Run(
            "Ferry's demo DiT, about 0.93 GiB fp32, 256 image + 32 text tokens",
            models.ModelSpec("dit", "fp32", size_gb=1.0),
            models.InputSpec(256, 32),
            tuple(m for m in mset if m != "ferry-block-disk-ckpt"),
            3,
        ),
    ]


# -- running ---------------------------------------------------------------------------------
def calibrate(
    spec: models.ModelSpec, model: torch.nn.Module, target_s: float, echo: Any
) -> models.InputSpec:
    """The square number of image tokens (text tokens: a quarter) whose resident forward
    takes closest to ``target_s`` on this machine, timed in this process."""
    best: tuple[float, models.InputSpec] | None = None
    with torch.no_grad():
        for k in range(6, 65, 2):
            inp = models.InputSpec(k * k, max(k * k // 4, 1))
            x = models.make_inputs(spec, inp, model)
            models.forward(model, x)
            t0 = time.perf_counter()
            models.forward(model, x)
            t = time.perf_counter() - t0
            echo(f"  calibrating: {inp.tokens} image tokens -> {t:.2f} s (target {target_s:.2f} s)")
            if best is None or abs(t - target_s) < abs(best[0] - target_s):
                best = (t, inp)
            if t > target_s:
                break
    assert best is not None
    return best[1]


def run_one(
    run: Run, workdir: Path, device: torch.device, opts: dict[str, Any], echo: Any, raw_gbps: float
) -> tuple[Run, list[dict[str, Any]]]:
    workdir.mkdir(parents=True, exist_ok=True)
    ckpt = workdir / "model.safetensors"
    inputs_file = workdir / "inputs.pt"
    echo(f"  building {run.model.label} ...")

    def inputs(model: torch.nn.Module) -> models.InputSpec:
        if run.inputs.tokens:
            return run.inputs
        nbytes = models.param_bytes(model)
        return calibrate(run.model, model, nbytes / (raw_gbps * GB), echo)

    prep = harness.prepare(run.model, ckpt, inputs)
    nbytes, n_params = prep.nbytes, prep.params
    if run.inputs.tokens == 0:
        run = replace(run, inputs=prep.input_spec)
        run = replace(
            run,
            title=f"{run.title}: {run.inputs.tokens} image + {run.inputs.txt_tokens} text tokens",
        )
    torch.save(prep.inputs, inputs_file)
    del prep
    echo(f"  {n_params / 1e6:.0f} M parameters, {fmt_bytes(nbytes)}")
    results = []
    for mode in run.modes:
        why = modes.peer_available(mode)
        if why is not None:
            results.append({"mode": mode, "skipped": why})
            echo(f"  {mode:24s} skipped: {why}")
            continue
        mdir = harness.fresh_dir(workdir, mode)
        job = {
            "mode": mode,
            "model": run.model.as_dict(),
            "inputs": run.inputs.__dict__,
            "device": str(device),
            "workdir": str(mdir),
            "checkpoint": str(ckpt),
            "inputs_file": str(inputs_file),
            "forwards": run.forwards,
            "opts": opts,
            "result_file": str(mdir / "result.json"),
        }
        res = harness.spawn("bench.worker", job)
        results.append(res)
        if "error" in res:
            echo(f"  {mode:24s} FAILED\n{res['error']}")
        else:
            echo(
                f"  {mode:24s} {res['seconds']:.3f} s/forward "
                f"(process {res['wall_s']:.0f} s: load {res['load_s']:.0f}, "
                f"apply {res['apply_s']:.0f}, warm-up {res['warmup_s']:.1f})"
            )
        # Leave nothing behind: the next mode starts from an empty folder.
        for p in mdir.iterdir():
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
    harness.judge(results)
    results_meta = {"params": n_params, "bytes": nbytes}
    for r in results:
        r.update(results_meta)
    ckpt.unlink()
    return run, results


def _base(results: list[dict[str, Any]]) -> int | None:
    bases = [r["base_rss"]["rss_anon"] for r in results if "base_rss" in r]
    return max(bases) if bases else None


# -- the command -----------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.compare",
        description=__doc__.split("\n")[0],
        epilog="modes: "
        + ", ".join(modes.all_modes())
        + ". Ferry suffixes: "
        + (modes.base_mode.__doc__ or "").split("Suffixes (Ferry only):")[-1].strip(),
    )
    p.add_argument("--suite", default="default", choices=["default", "quick"])
    p.add_argument("--model", choices=["flux", "dit"], help="one run of this model, not a suite")
    p.add_argument("--tokens", type=int, default=1024, help="image tokens (with --model)")
    p.add_argument("--txt-tokens", type=int, default=None, help="text tokens (default tokens/4)")
    p.add_argument("--layers", type=int, default=None, help="flux: double blocks")
    p.add_argument("--single-layers", type=int, default=None, help="flux: single blocks")
    p.add_argument("--heads", type=int, default=None, help="flux: heads (x128 = width)")
    p.add_argument(
        "--size-gb",
        type=float,
        default=1.0,
        help="dit: model size in the demo factory's decimal unit (1.0: about 0.93 GiB)",
    )
    p.add_argument("--dtype", choices=sorted(models.DTYPES), default=None)
    p.add_argument("--modes", default=None, help="comma-separated; default: all for the device")
    p.add_argument("--forwards", type=int, default=None, help="timed forwards per mode")
    p.add_argument("--prefetch", type=int, default=1, help="Ferry prefetch depth")
    p.add_argument("--blocks-per-group", type=int, default=1, help="Ferry and diffusers")
    p.add_argument("--device", default=None, help="onload device (default cuda if present)")
    p.add_argument("--workdir", default=None, help="scratch folder on the disk to test")
    p.add_argument("--out", default=None, help="also write the report (markdown) here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    workdir = Path(args.workdir or os.environ.get("FERRY_BENCH_DIR", "/tmp/ferry-bench")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    if args.model:
        base = FLUX_GPU if device.type != "cpu" else FLUX_CPU
        spec = base if args.model == "flux" else models.ModelSpec("dit", "fp32")
        spec = replace(
            spec,
            **{
                k: v
                for k, v in {
                    "layers": args.layers,
                    "single_layers": args.single_layers,
                    "heads": args.heads,
                    "dtype": args.dtype,
                    "size_gb": args.size_gb if args.model == "dit" else None,
                }.items()
                if v is not None
            },
        )
        txt = args.txt_tokens if args.txt_tokens is not None else max(args.tokens // 4, 1)
        mset = GPU_MODES if device.type != "cpu" else CPU_MODES
        runs = [
            Run(
                f"{args.tokens} image + {txt} text tokens",
                spec,
                models.InputSpec(args.tokens, txt),
                tuple(mset),
                args.forwards or 3,
            )
        ]
    else:
        runs = suite(args.suite, device)
    if args.modes:
        chosen = tuple(m.strip() for m in args.modes.split(",") if m.strip())
        unknown = {m for m in chosen if not modes.valid(m)}
        if unknown:
            print(f"unknown modes: {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        runs = [replace(r, modes=chosen) for r in runs]
    if args.forwards:
        runs = [replace(r, forwards=args.forwards) for r in runs]
    opts = {"prefetch": args.prefetch, "blocks_per_group": args.blocks_per_group}

    lines_out: list[str] = []
    raw: list[dict[str, Any]] = []

    def echo(s: str = "") -> None:
        print(s, flush=True)

    started = time.time()
    m = harness.machine(workdir)
    echo(f"machine: {m['cpu']}, {m['cores']} cores, {fmt_bytes(m['ram'])} RAM, GPU {m['gpu']}")
    echo(f"probing the raw disk read bandwidth of {m['disk']} ...")
    disk = probes.probe_disk(workdir)
    h2d = probes.probe_pinned_h2d() if device.type == "cuda" else None
    echo(
        f"raw cold read: {disk.raw_gbps:.2f} GB/s (1 thread {disk.one_thread_gbps:.2f}, "
        f"4 threads {disk.four_threads_gbps:.2f}, 1 MiB reads {disk.dd_like_gbps:.2f}); "
        f"pinned H2D: {f'{h2d:.1f} GB/s' if h2d else 'n/a (no CUDA)'}"
    )
    lines_out += _header(m, disk, h2d, device, argv)
    failed = False
    for run in runs:
        echo(f"\n## {run.title}")
        run, results = run_one(run, workdir, device, opts, echo, disk.raw_gbps)
        raw.append({"title": run.title, "model": run.model.as_dict(), "results": results})
        failed |= any(
            "error" in r or (r.get("equal") is False and r["mode"].startswith("ferry"))
            for r in results
        )
        lines = _section(run, results, disk, h2d, device)
        echo("\n".join(lines))
        lines_out += lines
    m_end = os.getloadavg()
    lines_out.append(
        f"Total {time.time() - started:.0f} s; load average at the start {m['load'][0]:.2f}, "
        f"at the end {m_end[0]:.2f}."
    )
    echo(lines_out[-1])
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("\n".join(lines_out) + "\n")
        Path(args.out).with_suffix(".json").write_text(
            json.dumps({"machine": m, "disk": disk.__dict__, "h2d": h2d, "runs": raw}, indent=1)
        )
        echo(f"report written to {args.out}")
    return 1 if failed else 0


def _section(
    run: Run,
    results: list[dict[str, Any]],
    disk: probes.DiskProbe,
    h2d: float | None,
    device: torch.device,
) -> list[str]:
    """One run's part of the report: what ran, its tables, the verdict, the notes."""
    main_t, ferry_t = report.forward_tables(results, disk.raw_gbps, h2d)
    r0 = results[0]
    res = next((r for r in results if r["mode"] == "resident" and "seconds" in r), None)
    cold_read = r0.get("bytes", 0) / (disk.raw_gbps * GB)
    lines = [
        f"### {run.title}",
        "",
        f"{run.model.label}: {r0.get('params', 0) / 1e6:.0f} M parameters, "
        f"{fmt_bytes(r0.get('bytes'))}; {run.inputs.tokens} image + {run.inputs.txt_tokens} "
        f"text tokens, batch {run.inputs.batch}; onload {device}; {run.forwards} timed "
        "forwards per mode after one warm-up. Process baseline (libraries imported, no "
        f"model): RssAnon {fmt_bytes(_base(results))}.",
        f"Cold read of all weights at the raw disk rate: {cold_read:.2f} s"
        + (
            f"; resident forward: {res['seconds']:.2f} s "
            f"(compute / cold read = {res['seconds'] / cold_read:.1f})"
            if res
            else ""
        )
        + ".",
        "",
        main_t,
        "",
    ]
    if ferry_t:
        lines += [ferry_t, ""]
    v = report.peer_verdict(results, modes.is_disk)
    if v:
        lines += [v, ""]
    notes = sorted({n for r in results for n in r.get("notes", [])})
    if notes:
        lines += ["Notes: " + "; ".join(notes), ""]
    return lines


def _header(
    m: dict[str, Any], disk: probes.DiskProbe, h2d: float | None, device: torch.device, argv: Any
) -> list[str]:
    cmd = "python -m bench.compare " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    return [
        report.machine_line(m, threads=True, python=True),
        f"Command: `{cmd.strip()}` (onload device {device}).",
        f"Raw cold disk read, measured in this run on a 1 GiB file: {disk.raw_gbps:.2f} GB/s "
        f"(one thread, 16 MiB reads: {disk.one_thread_gbps:.2f}; four threads: "
        f"{disk.four_threads_gbps:.2f}; 1 MiB reads: {disk.dd_like_gbps:.2f}). Pinned "
        f"host-to-device: {f'{h2d:.1f} GB/s' if h2d else 'n/a (no CUDA device)'}.",
        "",
    ]


if __name__ == "__main__":
    raise SystemExit(main())
