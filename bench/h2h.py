"""Head to head: resident, ComfyUI core's partial loading, Ferry and diffusers group offloading
sampling THE SAME model with the same sampler, VRAM capped like a consumer card.

    python -m bench.h2h [--comfy DIR] [--comfy-dynamic DIR] [--caps 12,24] [--steps 4] [--out F]

With ``--comfy`` (default: $FERRY_COMFYUI) every row runs real ComfyUI in process (KSampler on
a model loaded by ``comfy.sd``: full-size Flux-dev-shaped on a GPU, a tiny SD3 on a CPU);
without it, the ComfyUI rows are skipped and the others sample the bench model with an Euler
loop. ``--comfy-dynamic`` (default: $FERRY_COMFYUI_DYNAMIC) adds the ``dyn-*`` rows on a
current core (v0.33: dynamic VRAM, pinned memory, async offload by default; bench/h2h_comfy.py).
They run first: core's defaults and Ferry on that core, at the tightest cap first, are what a
10-minute call must not miss. Each row is a fresh process (bench/h2h_worker.py); its result is kept in the workdir, so
a second call (the next 10-minute slot on a lent GPU) resumes where the first stopped.
On a CPU (the dry run) the "cap" is 85 % of the model's bytes, so the offload paths run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench import harness, probes, report
from offload_core.units import GIB, MIB, fmt_bytes

REPO = harness.REPO
CPU_CAP = 0.85  # the dry run's "VRAM" cap, as a share of the model's bytes
COMFY_ROWS = ("comfy-lowvram", "comfy-lowvram-async")
# The current core's rows, in the order they run (see the module docstring).
DYN_ROWS = ("dyn-resident", "dyn-default", "dyn-ferry-pinned", "dyn-fast-disk", "dyn-ferry-disk")
ALL_ROWS = (*DYN_ROWS, "resident", *COMFY_ROWS, "ferry-pinned", "ferry-ram", "ferry-disk",
            "diffusers-block", "diffusers-disk")  # fmt: skip


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--comfy", default=os.environ.get("FERRY_COMFYUI") or None)
    p.add_argument("--comfy-python", default=os.environ.get("FERRY_COMFYUI_PYTHON") or None)
    p.add_argument("--comfy-dynamic", default=os.environ.get("FERRY_COMFYUI_DYNAMIC") or None)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--caps",
        default="12,24",
        help="VRAM caps in GiB, as cards are sold; CPU: one tiny cap",
    )
    p.add_argument("--rows", default=",".join(ALL_ROWS))
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--workdir", default=os.environ.get("FERRY_H2H_DIR", "/tmp/ferry-h2h"))
    p.add_argument("--out", default=None, help="also write the table here (markdown)")
    p.add_argument(
        "--budget-s",
        type=float,
        default=480.0,
        help="start no new row after this many seconds (a lent GPU's call is 600 s)",
    )
    p.add_argument("--fresh", action="store_true", help="forget the rows done by earlier calls")
    return p


def comfy_python(args: argparse.Namespace, comfy: str | None = None) -> str:
    """The Python that runs ``comfy`` (default ``--comfy``): --comfy-python for the first core,
    else the checkout's own venv, else this one."""
    comfy = comfy or args.comfy or args.comfy_dynamic
    if not comfy:
        return sys.executable
    if args.comfy_python and comfy == args.comfy:
        return str(args.comfy_python)
    venv = Path(comfy) / "venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def core_of(args: argparse.Namespace, row: str) -> str | None:
    return args.comfy_dynamic if row.startswith("dyn-") else args.comfy


def core_version(comfy: str | None) -> str:
    f = Path(comfy or "") / "comfyui_version.py"
    text = f.read_text() if f.is_file() else ""
    return text.split('__version__ = "')[1].split('"')[0] if '__version__ = "' in text else "?"


def has_module(python: str, name: str) -> bool:
    if python == sys.executable:
        return importlib.util.find_spec(name) is not None
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({name!r}) is None)"
    return subprocess.run([python, "-c", code], env=harness.worker_env()).returncode == 0


def prepare_model(args: argparse.Namespace, python: str, wd: Path) -> dict[str, Any]:
    """The model every row samples (made once per workdir) and what the worker needs of it."""
    comfy = args.comfy or args.comfy_dynamic
    if comfy:
        kind = "flux-dev" if args.device == "cuda" else "sd3-tiny"
        path = wd / f"{kind}.safetensors"
        if not path.exists():
            cmd = [python, "-m", "bench.h2h_models", comfy, kind, str(path)]
            subprocess.run(cmd, check=True, cwd=REPO, env=harness.worker_env())
        info = json.loads(path.with_suffix(".json").read_text())
        return {"backend": "comfy", "model": str(path), "info": info, "bytes": info["bytes"]}
    from bench import models

    size = 4.0 if args.device == "cuda" else 0.02
    spec = models.ModelSpec(kind="dit", dtype="bf16" if args.device == "cuda" else "fp32",
                            size_gb=size)  # fmt: skip
    path, inputs = wd / "plain-dit.safetensors", wd / "plain-dit-inputs.pt"
    if not path.exists():
        made = harness.prepare(spec, path, models.InputSpec(tokens=64, txt_tokens=16))
        torch.save(made.inputs, inputs)
    info = {"kind": spec.label}
    return {"backend": "plain", "model": str(path), "spec": spec.as_dict(), "inputs": str(inputs),
            "info": info, "bytes": path.stat().st_size}  # fmt: skip


def plan_rows(args: argparse.Namespace, prep: dict[str, Any], python: str):
    """[(row, cap_bytes)] to run and [(row, why)] skipped."""
    wanted = [r for r in args.rows.split(",") if r]
    unknown = sorted(set(wanted) - set(ALL_ROWS))
    if unknown:
        raise SystemExit(f"unknown rows {unknown}; rows: {', '.join(ALL_ROWS)}")
    skipped: list[tuple[str, str]] = []

    def skip(rows: Any, why: str) -> None:
        nonlocal wanted
        skipped.extend((r, why) for r in wanted if r in rows)
        wanted = [r for r in wanted if r not in rows]

    if prep["backend"] == "plain":
        skip(COMFY_ROWS, "FERRY_COMFYUI unset (no ComfyUI)")
    elif not args.comfy:
        skip(set(ALL_ROWS) - set(DYN_ROWS), "FERRY_COMFYUI unset (no legacy ComfyUI core)")
    if not args.comfy_dynamic:
        skip(DYN_ROWS, "FERRY_COMFYUI_DYNAMIC unset (no ComfyUI with dynamic VRAM)")
    if not has_module(python, "diffusers"):
        skip([r for r in wanted if r.startswith("diffusers")], "diffusers not installed")
    if args.device == "cuda":
        caps = [int(float(c) * GIB) for c in args.caps.split(",") if c]
    else:
        # The tiny model has 3 blocks: Ferry's streaming minimum (outside weights + 2 slots)
        # is ~78 % of it, so a smaller cap would only test the budget check.
        caps = [int(prep["bytes"] * CPU_CAP)]
    todo: list[tuple[str, int | None]] = []
    for group, ref in ((DYN_ROWS, "dyn-resident"), (set(ALL_ROWS) - set(DYN_ROWS), "resident")):
        rows = [r for r in ALL_ROWS if r in group and r in wanted]  # ALL_ROWS' order
        todo += [(ref, None)] if ref in rows else []
        todo += [(r, c) for c in caps for r in rows if r != ref]
    return todo, skipped


def run_row(args, prep, python, wd: Path, row: str, cap: int | None) -> dict[str, Any]:
    """One row in its own process (harness.spawn), with that row's core's Python; a row done
    by an earlier call (its result kept in the workdir) is not run again; a failed one is."""
    tag = f"{row}@{cap // MIB if cap else 'none'}"
    result = wd / "rows" / f"{tag}.json"
    if result.exists() and not args.fresh:
        done: dict[str, Any] = json.loads(result.read_text())
        if "error" not in done:
            return done
        result.unlink()
    result.parent.mkdir(parents=True, exist_ok=True)
    budget = "auto" if args.device == "cuda" else f"{cap / GIB:.6f}" if cap else "auto"
    python = comfy_python(args, core_of(args, row)) if prep["backend"] == "comfy" else python
    job = {**prep, "row": row, "device": args.device, "comfy_dir": core_of(args, row), "repo": str(REPO),
           "workdir": str(wd / f"scratch-{tag}"), "steps": args.steps, "warm_steps": 1, "seed": 7,
           "cap_bytes": cap, "ferry_budget": budget, "out": str(wd / "rows" / f"{tag}.pt"),
           "result_file": str(result), "threads": None}  # fmt: skip
    Path(job["workdir"]).mkdir(parents=True, exist_ok=True)
    out = harness.spawn("bench.h2h_worker", job, python=python)
    if not result.exists():  # the process died before writing: nothing to resume from
        return out
    out.update(cap=cap, tag=tag, latent=job["out"])
    result.write_text(json.dumps(out))
    return out


def judge(results: list[dict[str, Any]]) -> None:
    """Each row's ``equal``: its latent against its core's resident row's, byte for byte
    (NaN-safe), with ``max_diff`` or ``unequal_why`` where not equal; and whether its latent is
    finite."""
    refs = {r["row"]: r for r in results if r["row"] in ("resident", "dyn-resident")}
    for r in results:
        if "error" in r:
            continue
        ref = refs.get("dyn-resident" if r["row"].startswith("dyn-") else "resident")
        if ref is None or "error" in ref or not Path(r["latent"]).exists():
            r["equal"] = None
            continue
        a, b = torch.load(r["latent"]), torch.load(ref["latent"])
        if a.shape != b.shape:
            r["equal"], r["unequal_why"] = False, f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
            continue
        r["equal"] = torch.equal(a.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8))
        if not r["equal"]:
            a, b = a.float(), b.float()
            both_nan = a.isnan() & b.isnan()  # the same NaN is no difference
            r["max_diff"] = torch.where(both_nan, 0.0, a - b).abs().max().item()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    wd = Path(args.workdir)
    wd.mkdir(parents=True, exist_ok=True)
    python = comfy_python(args) if args.comfy or args.comfy_dynamic else sys.executable
    t0 = time.perf_counter()
    prep = prepare_model(args, python, wd)
    todo, skipped = plan_rows(args, prep, python)
    pinned = probes.probe_pinned_h2d() if args.device == "cuda" else None
    raw = probes.probe_disk(wd / "probe", 1 << 30 if args.device == "cuda" else 64 << 20).raw_gbps
    h2d = "-" if pinned is None else f"{pinned:.2f} GB/s"
    print(f"h2h: {prep['info'].get('kind')} ({fmt_bytes(prep['bytes'])} file), backend "
          f"{prep['backend']}, device {args.device}, {args.steps} steps; pinned H2D "
          f"{h2d}, raw disk read {raw:.2f} GB/s", flush=True)  # fmt: skip
    if args.device == "cpu":
        print(f"h2h: dry run on the CPU: the cap is {CPU_CAP:.0%} of the model's bytes; ComfyUI's lowvram "
              "rows get it through a shim (ComfyUI never partially loads onto a CPU)")  # fmt: skip
    if args.comfy_dynamic:
        print(f"h2h: dyn-* rows: ComfyUI {core_version(args.comfy_dynamic)} at {args.comfy_dynamic}"
              + ("; dynamic VRAM is off on a CPU (comfy-aimdo initialises CUDA/ROCm devices "
                 "only), so dyn-default and dyn-fast-disk run that core's legacy path, capped "
                 "through the same shim" if args.device == "cpu" else ""))  # fmt: skip
    results, not_run = [], []
    for row, cap in todo:
        if time.perf_counter() - t0 > args.budget_s:
            not_run.append(f"{row}@{cap}")
            continue
        r = run_row(args, prep, python, wd, row, cap)
        print(f"h2h: {row} cap={cap}: " + ("FAILED " + r["error"][-800:] if "error" in r
              else f"{r['s_step']:.3f} s/step"), flush=True)  # fmt: skip
        results.append(r)
    judge(results)
    text = report.h2h_table(results, pinned, raw) + report.h2h_core_notes(results)
    for row, why in skipped:
        text += f"\nskipped {row}: {why}"
    if not_run:
        text += f"\nnot run (time budget; run again to resume): {', '.join(not_run)}"
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
