"""Measuring one policy on one model: time per forward, peak VRAM, peak RAM.

The planner (autotune.py) calls this once per candidate; it knows nothing of budgets or
recommendations, only how to run a model under a policy and what it cost.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from ..api import apply_offload
from ..errors import FerryError
from ..policy import OffloadPolicy
from ..runtime.memory import PeakRssSampler, device_memory


@dataclass(frozen=True)
class Measurement:
    """What one policy cost. ``error`` is set (and the times are None) when it could not run."""

    seconds_per_forward: float | None
    peak_vram: int | None  # bytes, None where the device reports no memory (a CPU)
    peak_ram: int  # bytes: peak RssAnon + RssShmem (file-backed cache is reclaimable)
    peak_ram_file: int  # bytes: peak RssFile (page cache of group files)
    error: str | None = None


def measure_policy(
    model: torch.nn.Module,
    inputs: dict[str, Any],
    policy: OffloadPolicy,
    device: torch.device,
    *,
    name: str,
    steps: int,
    warmup: int,
) -> Measurement:
    """Offloads ``model`` with ``policy``, times ``steps`` forwards after ``warmup`` untimed
    ones, and removes the offload again (which deletes only the files it wrote)."""
    inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    _reset_peak(device)
    times: list[float] = []
    handle = None
    error: str | None = None
    sampler = PeakRssSampler(interval_s=0.005).start()
    try:
        handle = apply_offload(model, policy, onload_device=str(device), name=name)
        times = _timed_forwards(model, inputs, device, steps, warmup)
    except (FerryError, torch.OutOfMemoryError) as e:
        # A plan that does not fit this machine is a result (a row that says why), not a crash.
        error = f"{type(e).__name__}: {e}"
    finally:
        if handle is not None:
            handle.remove()
        peak = sampler.stop()
    ram = peak.rss_anon + peak.rss_shmem
    if error is not None:
        return Measurement(None, None, ram, peak.rss_file, error)
    dev = device_memory(device)
    vram = dev.peak_allocated if dev is not None else None
    return Measurement(statistics.median(times), vram, ram, peak.rss_file)


def _timed_forwards(
    model: torch.nn.Module, inputs: dict[str, Any], device: torch.device, steps: int, warmup: int
) -> list[float]:
    times = []
    with torch.inference_mode():
        for n in range(warmup + steps):
            t0 = time.perf_counter()
            model(**inputs)
            _sync(device)
            if n >= warmup:
                times.append(time.perf_counter() - t0)
    return times


def _sync(device: torch.device) -> None:
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


def _reset_peak(device: torch.device) -> None:
    if device.type == "cpu":
        return
    acc = torch.accelerator
    if hasattr(acc, "reset_peak_memory_stats"):
        acc.reset_peak_memory_stats(device)
    elif device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
