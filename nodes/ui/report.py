"""The memory report's text (pure; the report node and CI tests call it)."""

from __future__ import annotations

from typing import Any

from ...offload_core.offload_kind import OffloadKind, network_kind
from ...offload_core.runtime.memory import DeviceMemory, ProcessMemory
from ...offload_core.units import fmt_bytes
from . import prompt_reads


def _gbps(v: float | None) -> str:
    return f"{v:.2f} GB/s" if v else "-"


def memory_lines(proc: ProcessMemory, dev: DeviceMemory | None, device: str | None) -> list[str]:
    lines = [
        f"RAM (this process): anon {fmt_bytes(proc.rss_anon)}, file-backed {fmt_bytes(proc.rss_file)}, "
        f"shared {fmt_bytes(proc.rss_shmem)}"
    ]
    if dev is None:
        lines.append(f"VRAM: no accelerator in use ({device or 'cpu'})")
    else:
        total = f" of {fmt_bytes(dev.device_total)}" if dev.device_total else ""
        lines.append(
            f"VRAM ({device}): allocated {fmt_bytes(dev.allocated)}, reserved {fmt_bytes(dev.reserved)}, "
            f"peak {fmt_bytes(dev.peak_allocated)}, device used {fmt_bytes(dev.device_used)}{total}"
        )
    return lines


def offload_lines(stats: dict[str, Any]) -> list[str]:
    tiers = ", ".join(
        f"{k} {fmt_bytes(v)}" for k, v in (stats.get("bytes_per_tier") or {}).items() if v
    )
    kind = network_kind(stats.get("kind", OffloadKind.MODEL))
    title = kind.line_title(str(stats.get("name")))
    out = [
        f"{title}: {stats.get('level')} level, tier {stats.get('tier')}, "
        f"{stats.get('groups')} groups ({stats.get('resident_groups')} resident), "
        f"prefetch {stats.get('prefetch_depth')}",
        f"  where the weights are: {tiers or '-'}",
        f"  moved to {stats.get('device')}: {fmt_bytes(stats.get('bytes_h2d') or 0)} "
        f"({_gbps(stats.get('h2d_gbps'))}); read from disk: {fmt_bytes(stats.get('bytes_disk') or 0)} "
        f"({_gbps(stats.get('disk_gbps'))})",
        f"  forwards {stats.get('forwards')}, stall {float(stats.get('stall_s') or 0):.3f} s of "
        f"{float(stats.get('transfer_s') or 0):.3f} s transfer",
    ]
    prompt = prompt_reads.read_this_prompt(stats)
    if prompt is not None and stats.get("tier") == "disk":
        out.append(f"  read from disk this prompt: {fmt_bytes(prompt)}")
    why = stats.get("why")  # its planner's sentence, carried by its layout
    if why:
        out.append(f"  why: {why}")
    return out


def report_text(
    proc: ProcessMemory,
    dev: DeviceMemory | None,
    device: str | None,
    offloads: list[dict[str, Any]],
    plan_text: str | None = None,
) -> str:
    lines = ["Ferry memory report", *memory_lines(proc, dev, device)]
    if offloads:
        lines.append(f"Offloaded models: {len(offloads)}")
        for s in offloads:
            lines += offload_lines(s)
    else:
        lines.append(
            "Offloaded models: none live (a Ferry model lays out when it is first sampled)"
        )
    if plan_text:
        lines += ["Plan for the connected model:", plan_text]
    return "\n".join(lines)
