"""The live monitor tab: VRAM and RAM over the last minutes, and per-model offload stats.

The page only READS the monitor's ring buffer on a gr.Timer tick; sampling happens on the
monitor's own thread whether or not a page is open: a gr.Timer ticks once per open page,
so sampling on the tick would sample once per tab and stop when the last tab closes.
"""

from __future__ import annotations

from typing import Any

import gradio as gr
import pandas as pd

from ...offload_core.tools.monitor import Snapshot
from ...offload_core.units import GIB
from .compat import private_api
from .context import PanelContext
from .strip_view import strips_html

WINDOW_S = 300.0

VRAM_SERIES = (
    ("vram_allocated", "allocated by tensors"),
    ("vram_reserved", "reserved by PyTorch"),
    ("vram_device_used", "used on the GPU (all programs)"),
)
RAM_SERIES = (
    ("rss_anon", "own memory"),
    ("rss_file", "file cache (reclaimable)"),
    ("rss_shmem", "shared memory"),
)
# Its own plot: at tens of GiB it would flatten the process's lines to zero.
SYSTEM_SERIES = (("system_available", "still available"),)
OFFLOAD_COLUMNS = [
    "offloaded", "tier", "groups (resident)", "on GPU GiB", "in RAM GiB", "on disk GiB",
    "GPU copy GB/s", "disk read GB/s", "waiting s", "overlap %", "forwards", "why",
]  # fmt: skip


def series_frame(snap: Snapshot, series: tuple[tuple[str, str], ...]) -> pd.DataFrame:
    """Long form (seconds ago, GiB, series) for gr.LinePlot; fields a device does not tell are left out."""
    rows: list[tuple[float, float, str]] = []
    if snap.samples:
        now = snap.samples[-1].t
        for s in snap.samples:
            d = s.as_dict()
            for key, label in series:
                v = d.get(key)
                if v is not None:
                    rows.append((round(s.t - now, 1), v / GIB, label))
    return pd.DataFrame(rows, columns=["seconds", "GiB", "series"])


def offload_rows(snap: Snapshot) -> list[list[Any]]:
    out = []
    for o in snap.offloads:
        s = o.stats
        tiers = s.get("bytes_per_tier") or {}

        def gb(n: Any) -> Any:
            return round(n / GIB, 3) if isinstance(n, (int, float)) else "-"

        def num(v: Any, scale: float = 1.0, nd: int = 2) -> Any:
            return round(v * scale, nd) if isinstance(v, (int, float)) else "-"

        out.append([
            o.title,  # "text encoder: t5xxl": what the line is, not only its name
            s.get("tier", "-"),
            f"{s.get('groups', '-')} ({s.get('resident_groups', 0)})",
            gb(tiers.get("device")),
            gb((tiers.get("pinned") or 0) + (tiers.get("ram") or 0)),
            gb(tiers.get("disk")),
            num(s.get("h2d_gbps")),
            num(s.get("disk_gbps")),
            num(s.get("stall_s"), nd=3),
            num(s.get("overlap"), 100.0, 1),
            s.get("forwards", "-"),
            s.get("why") or "",  # its planner's sentence (its layout's), where it chose them
        ])  # fmt: skip
    return out


def status_line(snap: Snapshot) -> str:
    dev = snap.device or "none (CPU only: no VRAM to show)"
    state = "sampling every second" if snap.running else "sampler stopped"
    return f"{state} · {len(snap.samples)} samples · accelerator: {dev}"


def tick(
    ctx: PanelContext,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, list[list[Any]], str, str]:
    snap = ctx.monitor.snapshot(last_s=WINDOW_S)
    return (
        series_frame(snap, VRAM_SERIES),
        series_frame(snap, RAM_SERIES),
        series_frame(snap, SYSTEM_SERIES),
        offload_rows(snap),
        status_line(snap),
        strips_html(snap),  # where each group is now (strip_view.py)
    )


def build_monitor_tab(ctx: PanelContext, demo: gr.Blocks) -> None:
    gr.Markdown(
        "What your GPU and RAM are doing right now, over the last five minutes. "
        "If *system: still available* gets close to zero, the computer starts swapping: "
        "choose the disk tier or a smaller group size."
    )
    status = gr.Markdown(elem_id="ferry-monitor-status")
    has_gpu = ctx.monitor.device is not None
    with gr.Row():
        vram = gr.LinePlot(
            x="seconds", y="GiB", color="series", title="VRAM (GiB)", x_title="seconds ago",
            x_lim=[-WINDOW_S, 0], height=260, visible=has_gpu, elem_id="ferry-vram-plot",
        )  # fmt: skip
        ram = gr.LinePlot(
            x="seconds", y="GiB", color="series", title="RAM used by this process (GiB)",
            x_title="seconds ago", x_lim=[-WINDOW_S, 0], height=260, elem_id="ferry-ram-plot",
        )  # fmt: skip
        system = gr.LinePlot(
            x="seconds", y="GiB", color="series", title="RAM still available on the computer (GiB)",
            x_title="seconds ago", x_lim=[-WINDOW_S, 0], height=260, elem_id="ferry-system-plot",
        )  # fmt: skip
    if not has_gpu:
        gr.Markdown("No GPU found: there is no VRAM to plot on this machine.")
    gr.Markdown(
        "**Offloaded models and text encoders** (GB/s: how fast weights arrive; waiting: time "
        "the GPU sat idle for them)"
    )
    table = gr.Dataframe(headers=OFFLOAD_COLUMNS, interactive=False, elem_id="ferry-offloads")
    gr.Markdown(
        "**Where each group is now** (one cell per group: green on the device, amber in flight, "
        "grey waiting in RAM or on disk, dark green resident)"
    )
    strips = gr.HTML(elem_id="ferry-group-strips")
    outputs = [vram, ram, system, table, status, strips]
    timer = gr.Timer(1.0)
    timer.tick(lambda: tick(ctx), outputs=outputs, api_name="monitor", show_progress="hidden")
    # First paint without waiting a second for the timer.
    demo.load(lambda: tick(ctx), outputs=outputs, show_progress="hidden", **private_api())
