"""The planner tab: "find settings for this machine" (offload_core.tools.autotune) with a progress
bar, its table, time-vs-memory plots, the recommendation and one-click save."""

from __future__ import annotations

from typing import Any

import gradio as gr
import pandas as pd

from ...offload_core.errors import ConfigError, FerryError
from ...offload_core.policy import OffloadPolicy
from ...offload_core.runtime.memory import system_available_ram
from ...offload_core.tools.autotune import Budget, TuneResult, autotune, demo_factory
from ...offload_core.tools.machine_plan import plan_test_model
from ...offload_core.tools.settings_file import PanelSettings
from ...offload_core.units import GIB
from .context import PanelContext, one_run
from .disk_check import check_disk_path
from .forms import Form, form_from_settings

TABLE_COLUMNS = ["#", "plan", "s/forward", "peak VRAM GiB", "peak RAM GiB", "fits", "note"]


def result_frames(result: TuneResult) -> tuple[pd.DataFrame, pd.DataFrame]:
    table = pd.DataFrame([r.as_record() for r in result.rows], columns=TABLE_COLUMNS)
    ran = table[table["s/forward"].notna()]
    points = pd.DataFrame(
        {
            "plan": ran["plan"],
            "seconds per forward": ran["s/forward"].astype(float),
            "peak VRAM GiB": ran["peak VRAM GiB"].astype(float),
            "peak RAM GiB": ran["peak RAM GiB"].astype(float),
            "fits the budget": ran["fits"],
        }
    )
    return table, points


def run_planner(
    ctx: PanelContext,
    vram_gb: Any,
    ram_gb: Any,
    size_gb: Any,
    disk_path: str,
    progress: Any = None,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, str, dict[str, Any] | None]:
    """Measures the candidate plans; validates every input before any work."""
    # The boxes' values as they come (a browser's number box shows 0 when cleared: no limit,
    # as 0 is everywhere), through the one parser of each setting.
    budget = Budget.from_gb(vram_gb, ram_gb)
    if size_gb is None or not float(size_gb) > 0:
        raise ConfigError("size_gb", f"the demo model size must be > 0 GiB, got {size_gb!r}")
    disk = (disk_path or "").strip() or None
    if disk is not None:
        chk = check_disk_path(disk, int(float(size_gb) * GIB))
        if not chk.ok:
            raise ConfigError(
                "disk_path",
                chk.message + " (or clear it to skip the disk tier)",
            )
    with one_run(ctx, "run", "run the planner"):
        result = autotune(
            demo_factory(float(size_gb)),
            budget=budget,
            onload_device=ctx.onload_device,
            disk_path=disk,
            steps=2,
            progress=(lambda d, t, what: progress((d, t), desc=what))
            if progress is not None
            else None,
        )
    table, points = result_frames(result)
    best = result.recommended
    # Beside what was measured: what Ferry's planner chooses for it without measuring (the
    # choice "auto" gets in ComfyUI), in its own sentence.
    plan = plan_test_model(float(size_gb), onload_device=ctx.onload_device,
                           disk_path=disk, vram_budget=budget.vram_bytes, ram_budget=budget.ram_bytes)  # fmt: skip
    reason = f"{result.reason}\n\nFerry's planner (auto, not measured): {plan.choices[0].reason}"
    return table, points, points, reason, (best.policy.to_dict() if best else None)


def planner_event(ctx: PanelContext, vram_gb: Any, ram_gb: Any, size_gb: Any, disk_path: str,
                  progress: gr.Progress = gr.Progress()) -> tuple[Any, ...]:  # fmt: skip
    try:
        table, vram_pts, ram_pts, reason, best = run_planner(
            ctx, vram_gb, ram_gb, size_gb, disk_path, progress
        )
    except FerryError as e:
        empty = pd.DataFrame(columns=TABLE_COLUMNS)
        return empty, None, None, f"✖ {e}", None
    return table, vram_pts, ram_pts, ("✔ " if best else "✖ ") + reason, best


def save_recommended(ctx: PanelContext, best: dict[str, Any] | None, quant: str) -> list[Any]:
    """Saves the recommended plan (keeping the chosen quantization) and fills the settings form."""
    if not best:
        return [gr.skip()] * len(Form._fields) + [
            "✖ Nothing to save yet: run the planner first (or no plan fit)."
        ]
    try:
        settings = PanelSettings(OffloadPolicy.from_dict(best), quant or "none")
        path = ctx.save(settings)
    except FerryError as e:
        return [gr.skip()] * len(Form._fields) + [f"✖ Not saved. {e}"]
    form = form_from_settings(settings)
    return [*form, f"✔ Saved the recommended plan to `{path}`; the Settings tab shows it."]


def build_planner_tab(ctx: PanelContext, form: list[Any]) -> None:
    gr.Markdown(
        "**Find settings for this machine.** Ferry runs a test model under a few plans, measures "
        "how fast each one is and how much VRAM and RAM it takes, and recommends the fastest one "
        "that fits your budget. If the disk folder on the Settings tab is filled in, the disk tier "
        "is tried too."
    )
    dev_total = None
    snap = ctx.monitor.snapshot()
    if snap.samples and snap.samples[-1].vram_total:
        dev_total = round(snap.samples[-1].vram_total / GIB, 1)
    with gr.Row():
        vram = gr.Number(
            value=dev_total, label="VRAM budget (GiB, 0 = no limit)", elem_id="ferry-plan-vram"
        )
        ram = gr.Number(value=round(system_available_ram() * 0.8 / GIB, 1), label="RAM budget (GiB, 0 = no limit)",
                        elem_id="ferry-plan-ram")  # fmt: skip
        size = gr.Number(value=ctx.demo.size_gb if ctx.demo else 0.25, label="Test model size (GiB)", minimum=0.001,
                         elem_id="ferry-plan-size")  # fmt: skip
    run = gr.Button("Find settings for this machine", variant="primary", elem_id="ferry-plan-run")
    verdict = gr.Markdown(elem_id="ferry-plan-verdict")
    table = gr.Dataframe(headers=TABLE_COLUMNS, interactive=False, elem_id="ferry-plan-table")
    with gr.Row():
        vram_plot = gr.ScatterPlot(x="peak VRAM GiB", y="seconds per forward", color="fits the budget",
                                   title="Time vs peak VRAM", height=260, elem_id="ferry-plan-vram-plot")  # fmt: skip
        ram_plot = gr.ScatterPlot(x="peak RAM GiB", y="seconds per forward", color="fits the budget",
                                  title="Time vs peak RAM", height=260, elem_id="ferry-plan-ram-plot")  # fmt: skip
    best = gr.State(None)
    save_btn = gr.Button("Save the recommended plan", elem_id="ferry-plan-save")
    saved = gr.Markdown(elem_id="ferry-plan-saved")
    disk_path, quant = form[3], form[7]
    run.click(lambda v, r, s, d, progress=gr.Progress(): planner_event(ctx, v, r, s, d, progress),
              inputs=[vram, ram, size, disk_path], outputs=[table, vram_plot, ram_plot, verdict, best],
              api_name="run_planner")  # fmt: skip
    save_btn.click(lambda b, q: save_recommended(ctx, b, q), inputs=[best, quant], outputs=[*form, saved],
                   api_name="save_recommended")  # fmt: skip
