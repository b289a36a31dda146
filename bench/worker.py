"""One mode, one fresh process (so peak memory of one mode never mixes with another's):

    python -m bench.worker '<json job>'

Loads the model from the shared checkpoint, applies the mode, runs one untimed warm-up
forward (Ferry traces its order, diffusers writes its disk files), then times ``forwards``
back-to-back forwards; before each, the page cache of every file the mode reads is dropped
(inside the timed loop: a real sampling loop leaves no pause for prefetching either).
Writes a JSON result and the outputs of the warm-up and last forward for torch.equal.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench import harness, models, modes, probes
from offload_core.runtime.memory import PeakRssSampler, process_memory, release_freed_memory


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(job: dict[str, Any]) -> dict[str, Any]:
    spec = models.ModelSpec(**job["model"])
    device = torch.device(job["device"])
    mode = job["mode"]
    workdir = Path(job["workdir"])
    checkpoint = Path(job["checkpoint"])
    if job.get("threads"):
        torch.set_num_threads(job["threads"])
    # Every mode imports the same libraries, so their memory is the same in every row.
    for pkg in ("diffusers", "accelerate"):
        if importlib.util.find_spec(pkg) is not None:
            importlib.import_module(pkg)
    if importlib.util.find_spec("diffusers") is not None:
        import diffusers.hooks  # noqa: F401
    base = process_memory()

    t0 = time.perf_counter()
    model = models.load_model(spec, checkpoint)
    x = models.to_device(torch.load(job["inputs_file"]), device)
    load_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    applied = modes.apply_mode(mode, model, device, workdir, checkpoint, job.get("opts", {}))
    apply_s = time.perf_counter() - t0
    after_apply = process_memory()

    with torch.no_grad():
        t0 = time.perf_counter()
        first = models.forward(model, x).detach().to("cpu", copy=True)
        _sync(device)
        warmup_s = time.perf_counter() - t0

        before = applied.stats() if applied.stats else None
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        if applied.files:
            probes.drop_page_cache(applied.files)  # flushes what the mode wrote, untimed
        drop_s = 0.0
        io0 = probes.storage_read_bytes()
        n = job["forwards"]
        sampler = PeakRssSampler(interval_s=0.005).start()
        t0 = time.perf_counter()
        for _ in range(n):
            if applied.files:
                d0 = time.perf_counter()
                probes.drop_page_cache(applied.files)
                drop_s += time.perf_counter() - d0
            out = models.forward(model, x)
        _sync(device)
        seconds = (time.perf_counter() - t0) / n
        peak = sampler.stop()
        read_bytes = probes.storage_read_bytes() - io0
        after = applied.stats() if applied.stats else None
        peak_vram = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        last = out.detach().to("cpu", copy=True)
        del out
        # What the process would hold if freed heap memory were handed back (Ferry does
        # this itself at apply; the peers do not, so their peak may include freed weights).
        release_freed_memory()
        trimmed = process_memory()

        to_device = None
        if device.type != "cpu":
            if after is not None:
                to_device = (after["bytes_h2d"] - before["bytes_h2d"]) // n  # type: ignore[index]
            else:
                # Peers copy on the calling thread: count one extra (untimed) forward.
                with probes.H2DCounter(device) as counter:
                    models.forward(model, x)
                    _sync(device)
                to_device = counter.nbytes

    ferry = None
    if before is not None and after is not None:
        ferry = {
            k: (after[k] - before[k]) / n for k in after if k not in ("groups", "prefetch_depth")
        }
        ferry["groups"] = after["groups"]
        ferry["prefetch_depth"] = after["prefetch_depth"]
    out_file = workdir / f"out-{mode}.pt"
    torch.save({"first": first, "last": last}, out_file)
    if applied.cleanup is not None:
        applied.cleanup()
    return {
        "mode": mode,
        "seconds": seconds,
        "forwards": n,
        "load_s": load_s,
        "apply_s": apply_s,
        "warmup_s": warmup_s,
        "drop_s": drop_s / n,
        "peak_rss": peak.as_dict(),
        "after_apply_rss": after_apply.as_dict(),
        "base_rss": base.as_dict(),
        "trimmed_rss": trimmed.as_dict(),
        "peak_vram": peak_vram,
        "disk_read_per_fwd": read_bytes / n,
        "to_device_per_fwd": to_device,
        "ferry": ferry,
        "notes": applied.notes,
        "out_file": str(out_file),
        "threads": torch.get_num_threads(),
    }


if __name__ == "__main__":
    os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")
    raise SystemExit(harness.job_main(sys.argv[1:], run))
