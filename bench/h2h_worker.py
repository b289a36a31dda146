"""One head-to-head row, in a fresh process (so one row's RAM peak never mixes with another's):

    python -m bench.h2h_worker '<json job>'   (bench/h2h.py starts it through harness.spawn)

Backend ``comfy``: real ComfyUI in process, the model from ``comfy.sd``, KSampler (see
bench/h2h_comfy.py). Backend ``plain`` (no ComfyUI): the bench model and an Euler loop over
the same steps, offloaded by bench/modes.py. Both: a warm-up sample (loads the model onto the
device, lets Ferry lay out and diffusers trace), then a timed sample; on a GPU the cap is a
"squatter" allocation that leaves exactly the cap free, so every system sees the same card.
Disk rows have their files' page cache dropped at every step boundary (inside the timed loop,
its time subtracted), so their reads come from the disk, not from RAM.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench import harness, probes
from offload_core import PeakRssSampler, process_memory
from offload_core.units import fmt_bytes


def squat(device: torch.device, cap_bytes: int | None) -> torch.Tensor | None:
    """Allocates all free device memory but ``cap_bytes``: the card now has the cap free."""
    if device.type != "cuda" or cap_bytes is None:
        return None
    free, _total = torch.cuda.mem_get_info(device)
    if free <= cap_bytes:
        raise RuntimeError(f"only {fmt_bytes(free)} free, cannot cap at {fmt_bytes(cap_bytes)}")
    return torch.empty(free - cap_bytes, dtype=torch.uint8, device=device)


class StepClock:
    """Wall time per sampling step, minus the page-cache drops done between steps."""

    def __init__(self, device: torch.device, disk_files: list[Path]) -> None:
        self.device, self.files = device, disk_files
        self.marks: list[float] = []
        self.drop_s = 0.0

    def start(self) -> None:
        self.marks, self.drop_s = [time.perf_counter()], 0.0
        self.drop()

    def step(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.marks.append(time.perf_counter())
        self.drop()

    def drop(self) -> None:
        if self.files:
            t0 = time.perf_counter()
            probes.drop_page_cache(self.files)
            self.drop_s += time.perf_counter() - t0

    def seconds(self) -> float:
        return self.marks[-1] - self.marks[0] - self.drop_s


def run_comfy(job: dict[str, Any], clock_box: list[StepClock]) -> dict[str, Any]:
    from bench import h2h_comfy as hc

    row, device = job["row"], torch.device(job["device"])
    workdir = Path(job["workdir"])
    core = hc.setup(job["comfy_dir"], device.type, row)
    pack = hc.load_pack(Path(job["repo"]), workdir / f"base-{row}") if "ferry" in row else None
    capped_core = row.startswith("comfy-lowvram") or row in ("dyn-default", "dyn-fast-disk")
    if device.type == "cpu" and capped_core and not core["dynamic_vram"]:
        hc.lowvram_shim(job["cap_bytes"])
    patcher = hc.load_model(job["model"])
    model = hc.apply_row(row, patcher, workdir, job["ferry_budget"])
    files = [workdir / "ferry", workdir / "diffusers"] if row.endswith("-disk") else []
    clock = StepClock(device, files)
    clock_box.append(clock)

    def sample(steps: int) -> torch.Tensor:
        import comfy.utils

        comfy.utils.set_progress_bar_global_hook(
            lambda v, total, *a, **k: clock.step() if total == steps else None
        )
        return hc.ksample(model, job["info"], steps, job["seed"])

    stats = (lambda: hc.ferry_stats(pack, model)) if pack else (lambda: None)
    return {**measure(job, device, sample, stats, clock), "core": core}


def run_plain(job: dict[str, Any], clock_box: list[StepClock]) -> dict[str, Any]:
    from bench import models, modes

    device = torch.device(job["device"])
    spec = models.ModelSpec(**job["spec"])
    model = models.load_model(spec, Path(job["model"]))
    inputs = models.to_device(torch.load(job["inputs"]), device)
    applied = modes.apply_mode(PLAIN_MODES[job["row"]], model, device, Path(job["workdir"]),
                               Path(job["model"]), {})  # fmt: skip
    clock = StepClock(device, applied.files)
    clock_box.append(clock)
    key, tkey = ("img", "timesteps") if spec.kind == "dit" else ("hidden_states", "timestep")

    def sample(steps: int) -> torch.Tensor:
        # Euler over a linear schedule, as a sampler would call the model.
        x = dict(inputs)
        sigmas = torch.linspace(1.0, 0.0, steps + 1)
        for i in range(steps):
            x[tkey] = torch.full_like(inputs[tkey], float(sigmas[i]))
            v = models.forward(model, x)
            x[key] = (x[key] + (sigmas[i + 1] - sigmas[i]) * v).to(inputs[key].dtype)
            clock.step()
        return x[key].detach().to("cpu", copy=True)

    def stats() -> dict[str, Any] | None:
        return applied.stats() if applied.stats else None

    return measure(job, device, sample, stats, clock)


# The plain backend's rows, as bench/modes.py names them.
PLAIN_MODES = {
    "resident": "resident",
    "ferry-pinned": "ferry-block-pinned",
    "ferry-ram": "ferry-block-ram",
    "ferry-disk": "ferry-block-disk",
    "diffusers-block": "diffusers-block",
    "diffusers-disk": "diffusers-block-disk",
}


def measure(job: dict[str, Any], device: torch.device, sample: Any, stats: Any, clock: StepClock):
    """Warm-up sample, then the timed one; peaks, bytes moved, the latent."""
    steps = job["steps"]
    t0 = time.perf_counter()
    clock.start()
    sample(job["warm_steps"])
    warm_s = time.perf_counter() - t0
    before = stats()
    io0 = probes.storage_read_bytes()
    clock.start()
    latent = sample(steps)
    seconds = clock.seconds()
    read = probes.storage_read_bytes() - io0
    after = stats()
    h2d = None
    if device.type != "cpu" and after is None:  # peers copy on this thread: count one step
        with probes.H2DCounter(device) as counter:
            sample(1)
        h2d = counter.nbytes
    out = {"s_step": seconds / steps, "warm_s": warm_s, "disk_read_step": read / steps,
           "h2d_step": h2d, "latent_finite": bool(torch.isfinite(latent).all())}  # fmt: skip
    if before is not None and after is not None:
        out["h2d_step"] = (after["bytes_h2d"] - before["bytes_h2d"]) / steps
        out["ferry"] = {k: after[k] for k in ("h2d_gbps", "disk_gbps", "stall_s") if k in after}
        out["ferry"]["resident_groups"] = after.get("resident_groups")
        out["ferry"]["groups"] = after.get("groups")
    torch.save(latent.cpu(), job["out"])
    return out


def main(job: dict[str, Any]) -> dict[str, Any]:
    device = torch.device(job["device"])
    if job.get("threads"):
        torch.set_num_threads(job["threads"])
    keep = squat(device, job.get("cap_bytes") if job["row"] != "resident" else None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    base = process_memory()
    sampler = PeakRssSampler(interval_s=0.005).start()
    boxes: list[StepClock] = []
    run = run_comfy if job["backend"] == "comfy" else run_plain
    out = run(job, boxes)
    peak = sampler.stop()
    squatted = keep.numel() if keep is not None else 0
    if device.type == "cuda":
        out["peak_vram"] = torch.cuda.max_memory_allocated(device) - squatted
    out.update(row=job["row"], rss_anon=peak.rss_anon, rss_file=peak.rss_file,
               base_anon=base.rss_anon)  # fmt: skip
    return out


if __name__ == "__main__":
    sys.exit(harness.job_main(sys.argv[1:], main))
