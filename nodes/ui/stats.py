"""The one JSON shape the sidebar reads, pushed as ``ferry.stats`` and served at /ferry/stats.

Pure (no ComfyUI import): built from the monitor's sample and the live offloads' stats.
"""

from __future__ import annotations

import time
from typing import Any

from ...offload_core.tools.monitor import OffloadSample, Sample
from . import prompt_reads

EVENT = "ferry.stats"

# OffloadStats fields the sidebar shows; the rest stays server-side (notes can be long).
_OFFLOAD_FIELDS = (
    "device", "level", "tier", "groups", "resident_groups", "prefetch_depth", "forwards",
    "group_loads", "bytes_per_tier", "bytes_h2d", "bytes_disk", "h2d_gbps", "disk_gbps",
    "transfer_s", "stall_s", "overlap", "peak_vram", "disk_folder", "group_states",
)  # fmt: skip


def running_prompt_id() -> str | None:
    """The id of the prompt ComfyUI runs now (None outside ComfyUI, or when idle)."""
    try:
        import server
    except ImportError:
        return None
    try:
        running = server.PromptServer.instance.prompt_queue.currently_running
        ids = [item[1] for item in list(running.values()) if len(item) > 1]
    except (AttributeError, TypeError):
        return None
    return str(ids[0]) if ids else None


def fresh_sample(device: str | None) -> Sample:
    """RAM and VRAM read now, shaped like the monitor's samples."""
    from ...offload_core.tools.monitor import read_sample

    return read_sample(device)


def current_offloads() -> list[OffloadSample]:
    """Every live offload's stats read now (the monitor's copy is up to a tick old)."""
    from ...offload_core.tools.monitor import read_offloads

    return read_offloads()


def offload_entry(o: OffloadSample) -> dict[str, Any]:
    # Each line says what it is (a diffusion model, a text encoder) in words the browser
    # shows as they are: ``kind`` is for code, ``title`` for people.
    what = {"name": o.name, "kind": o.kind.value, "title": o.title}
    s = o.stats
    if "error" in s:
        return {**what, "error": s["error"]}
    out = {k: s.get(k) for k in _OFFLOAD_FIELDS}
    out.update(what)
    out["tiers"] = {k: v for k, v in (s.get("bytes_per_tier") or {}).items() if v}
    # Why its tier, groups and look-ahead: its planner's sentence (its layout's), where the
    # planner chose them.
    out["why"] = s.get("why")
    # What the disk tier cost this prompt (the running one, or the last one seen).
    out["disk_read_last_prompt"] = prompt_reads.read_this_prompt(s)
    # "Bytes moved": what reached the compute device. From disk onto a CPU nothing is
    # copied host-to-device (the read lands in the slot), so the disk bytes count there.
    out["bytes_moved"] = max(int(s.get("bytes_h2d") or 0), int(s.get("bytes_disk") or 0))
    return out


def observe_prompt(prompt_id: str | None, offloads: list[OffloadSample]) -> None:
    """Tells prompt_reads which prompt runs now, with each offload's stats."""
    prompt_reads.observe(prompt_id, [o.stats for o in offloads if "error" not in o.stats])


def stats_payload(
    sample: Sample | None, offloads: list[OffloadSample], device: str | None
) -> dict[str, Any]:
    vram = None
    ram = None
    t = time.time()
    if sample is not None:
        t = sample.t
        if sample.vram_allocated is not None:
            vram = {
                "allocated": sample.vram_allocated,
                "reserved": sample.vram_reserved,
                "device_used": sample.vram_device_used,
                "total": sample.vram_total,
            }
        ram = {
            "rss_anon": sample.rss_anon,
            "rss_file": sample.rss_file,
            "rss_shmem": sample.rss_shmem,
            "system_available": sample.system_available,
        }
    return {
        "t": t,
        "device": device,
        "vram": vram,
        "ram": ram,
        "offloads": [offload_entry(o) for o in offloads],
    }
