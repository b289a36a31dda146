"""Two checkouts of offload_core, A/B in one process: is a change faster, slower, or noise?

This checkout's offload_core is A; another checkout's (a git worktree of an older commit) is
imported beside it as B under another name (the package uses relative imports only). One
process holds the resident model and, per disk read path, A's and B's offloaded copies, and
alternates their forwards (resident, A, B, ...; each offload's files dropped from the page
cache before its forward), so a shared machine's drift moves every ratio alike. Reports, per
path, the median of the per-round ratios A/B and each against resident; every output is
compared with the resident one (torch.equal).

    git worktree add /tmp/ferry-old <commit>
    python -m bench.ab_versions --other /tmp/ferry-old --tokens 1024 --txt-tokens 256 --rounds 5

``--levels block,leaf`` compares both grouping levels (default prefetch depth).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from bench import harness, models, probes, report


def import_other(checkout: Path, name: str = "offload_core_b") -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        name,
        checkout / "offload_core" / "__init__.py",
        submodule_search_locations=[str(checkout / "offload_core")],
    )
    if spec is None or spec.loader is None:
        raise SystemExit(f"--other: no offload_core package in {checkout}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def offload(
    core: ModuleType,
    model: Any,
    folder: Path,
    cpu_read: str,
    level: str = "block",
    checkpoint: Path | None = None,
) -> tuple[Any, list[Path]]:
    """``cpu_read`` "ckpt": copy reads from the model's own checkpoint (``source_checkpoint``),
    nothing written."""
    source = str(checkpoint) if cpu_read == "ckpt" else None
    tier = core.DiskTier(
        str(folder), cpu_read="copy" if source else cpu_read, source_checkpoint=source
    )
    lvl = core.LeafLevel() if level == "leaf" else core.BlockLevel(1)
    policy = core.OffloadPolicy(level=lvl, tier=tier)
    handle = core.apply_offload(model, policy, onload_device="cpu")
    files = sorted(Path(handle.stats().disk_folder).glob("group-*.safetensors"))
    return handle, files + ([Path(source)] if source else [])


def timed(model: Any, x: dict[str, Any], files: list[Path]) -> tuple[torch.Tensor, float]:
    if files:
        probes.drop_page_cache(files)
    t0 = time.perf_counter()
    out = models.forward(model, x)
    return out, time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--other", type=Path, required=True, help="the other checkout (B)")
    p.add_argument("--this", type=Path, default=None, help="A from this checkout instead")
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--txt-tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--paths",
        default="mapped,copy",
        help="DiskTier cpu_read values to compare; ckpt: copy from the model's checkpoint",
    )
    p.add_argument("--levels", default="block", help="block, leaf or both (block,leaf)")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/ferry-ab"))
    a = p.parse_args()
    a.workdir = a.workdir.resolve()  # the disk tier takes full paths only
    if a.this is not None:
        core_a = import_other(a.this.resolve(), "offload_core_a")
    else:
        import offload_core as core_a
    core_b = import_other(a.other.resolve())
    spec = models.ModelSpec("flux", "fp32", layers=4, single_layers=8, heads=12)
    inp = models.InputSpec(a.tokens, a.txt_tokens)
    prep = harness.prepare(spec, a.workdir / "ab-model.safetensors", inp)
    ckpt, x = prep.checkpoint, prep.inputs
    runs: dict[str, tuple[Any, list[Path]]] = {"resident": (models.load_model(spec, ckpt), [])}
    handles = []
    paths = [f"{lv}-{p}" for lv in a.levels.split(",") for p in a.paths.split(",")]
    for path in paths:
        for label, core in (("A", core_a), ("B", core_b)):
            m = models.load_model(spec, ckpt)
            level, cpu_read = path.split("-")
            h, files = offload(core, m, a.workdir / f"{label}-{path}", cpu_read, level, ckpt)
            handles.append(h)
            runs[f"{label}-{path}"] = (m, files)
    times: dict[str, list[float]] = {k: [] for k in runs}
    equal = dict.fromkeys(runs, True)
    with torch.no_grad():
        ref = models.forward(runs["resident"][0], x)
        for name, (m, _) in runs.items():  # warm-up: the engines trace their order
            equal[name] &= torch.equal(models.forward(m, x), ref)
        for r in range(a.rounds):
            for name, (m, files) in runs.items():
                out, seconds = timed(m, x, files)
                times[name].append(seconds)
                equal[name] &= torch.equal(out, ref)
            print(f"  round {r + 1}/{a.rounds}: " + ", ".join(f"{n} {t[-1]:.2f} s" for n, t in times.items()), flush=True)  # fmt: skip
    title = (
        f"Flux 4+8 blocks fp32, {a.tokens}+{a.txt_tokens} tokens, {a.rounds} rounds, cold page "
        f"cache; A = {a.this or 'this checkout'}, B = {a.other}"
    )
    print("\n" + report.ab_table(times, equal, paths, title), flush=True)
    # One at a time, each model let go once removed: remove() puts a model back in RAM, and
    # eight of them at once outgrow it.
    for h in handles:
        h.remove()
        runs.pop(next(k for k, (m, _) in runs.items() if m is h.model))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
