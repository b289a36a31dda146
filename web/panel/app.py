"""Assembles the panel: the live monitor on top (always visible), Settings and Planner below."""

from __future__ import annotations

from typing import Any

import gradio as gr

from ...offload_core.errors import FerryError
from .context import PanelContext
from .monitor_view import build_monitor_tab
from .planner_view import build_planner_tab
from .settings_view import build_settings_tab

TITLE = "Ferry: run models that do not fit your GPU"


def _run_demo(ctx: PanelContext, seconds: Any, progress: gr.Progress = gr.Progress()) -> str:
    try:
        return "✔ " + ctx.run_demo(
            float(seconds or 10), progress=lambda f: progress(f, desc="running the demo model")
        )
    except FerryError as e:
        return f"✖ {e}"


def build_panel(ctx: PanelContext) -> gr.Blocks:
    with gr.Blocks(title="Ferry", analytics_enabled=False) as demo:
        gr.Markdown(f"## {TITLE}")
        build_monitor_tab(ctx, demo)
        if ctx.demo is not None:
            with gr.Row():
                seconds = gr.Slider(2, 60, value=10, step=1, label="Run the built-in demo model for (seconds)",
                                    elem_id="ferry-demo-seconds")  # fmt: skip
                run = gr.Button("Run the demo model", elem_id="ferry-demo-run")
            demo_status = gr.Markdown(ctx.last_status, elem_id="ferry-demo-status")
            run.click(lambda s, progress=gr.Progress(): _run_demo(ctx, s, progress), inputs=seconds,
                      outputs=demo_status, api_name="run_demo")  # fmt: skip
        with gr.Tabs():
            with gr.Tab("Settings", elem_id="ferry-tab-settings"):
                form = build_settings_tab(ctx, demo)
            with gr.Tab("Find settings for this machine", elem_id="ferry-tab-planner"):
                build_planner_tab(ctx, form)
    return demo
