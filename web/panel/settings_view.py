"""The settings tab: offload settings in plain words, a live preview of where the weights
go, the disk-folder check as it is typed, Save (the file the nodes read) and Apply."""

from __future__ import annotations

from typing import Any

import gradio as gr
import pandas as pd

from ...offload_core.control_defaults import CONTROL_DEFAULTS as DEFAULTS
from ...offload_core.errors import ConfigError, FerryError
from ...offload_core.tools.settings_file import known_quant_presets
from ...offload_core.units import GIB, fmt_bytes
from ...seam.choices import level_choices, tier_choices
from .compat import private_api, public_api
from .context import PanelContext
from .disk_check import check_disk_path, markdown
from .forms import Form, form_from_settings, settings_from_form

PLACES = (
    ("device", "on the GPU (at peak)"),
    ("pinned", "pinned RAM"),
    ("ram", "RAM"),
    ("disk", "disk"),
)


def quant_choices(device: str) -> list[tuple[str, str]]:
    """(label, name) per preset; presets this machine cannot run are marked, not hidden."""
    try:
        from ...offload_core.quant import PRESETS, presets_for_device
    except ImportError:
        return [(n, n) for n in known_quant_presets()]
    runnable = set(presets_for_device(device))
    out = []
    for name, preset in PRESETS.items():
        note = "" if name in runnable else " (not on this machine)"
        out.append((f"{name}: {preset.summary}{note}", name))
    return out


def preview(ctx: PanelContext, *values: Any) -> tuple[pd.DataFrame, str]:
    """Where the weights would live with these settings (a plan: nothing moves)."""
    empty = pd.DataFrame({"where": [p[1] for p in PLACES], "GiB": [0.0] * len(PLACES)})
    try:
        settings = settings_from_form(*values)
        plan = ctx.plan(settings.policy)
    except FerryError as e:
        return empty, f"✖ {e}"
    if plan is None:
        return empty, "No model loaded yet: the preview appears when an offloaded model is loaded."
    per = plan.bytes_per_tier()
    frame = pd.DataFrame(
        {"where": [label for _, label in PLACES], "GiB": [per.get(k, 0) / GIB for k, _ in PLACES]}
    )
    streamed = len(plan.streamed)
    lines = [
        f"**{len(plan.groups)} groups**, {streamed} streamed and {len(plan.groups) - streamed} kept on the GPU; "
        f"blocks per group can go up to **{plan.max_blocks_per_group}** for this model.",
        f"GPU at peak: **{fmt_bytes(per.get('device', 0))}** · "
        f"waiting in {settings.policy.tier_name}: **{fmt_bytes(plan.offloaded_bytes)}**",
    ]
    lines += [f"note: {n}" for n in plan.notes]
    if ctx.reference_model() is None:
        lines.insert(
            0,
            "This is the loaded model's **current** plan; Apply to offload it with these settings.",
        )
    return frame, "\n\n".join(lines)


def check_disk(ctx: PanelContext, disk_path: str) -> str:
    """The disk-path field's live check. Reads only the path typed in that field."""
    return markdown(check_disk_path(disk_path, ctx.needed_disk_bytes()))


def _validated(ctx: PanelContext, values: tuple[Any, ...]) -> Any:
    settings = settings_from_form(*values)
    if settings.policy.tier_name == "disk":
        check_disk_path(Form(*values).disk_path, ctx.needed_disk_bytes()).raise_if_bad()
    top = ctx.max_blocks()
    k = getattr(settings.policy.level, "blocks_per_group", 1)
    if k > top:
        raise ConfigError(
            "blocks_per_group", f"this model has at most {top} blocks in a row; choose 1..{top}"
        )
    ctx.plan(settings.policy)  # any other setting the model cannot take fails here, before saving
    return settings


def save(ctx: PanelContext, *values: Any) -> str:
    try:
        settings = _validated(ctx, values)
        path = ctx.save(settings)
    except FerryError as e:
        return f"✖ Not saved. {e}"
    return f"✔ Saved to `{path}`: {ctx.saved_note}"


def apply(ctx: PanelContext, *values: Any) -> str:
    try:
        settings = _validated(ctx, values)
        lines = ctx.reapply(settings.policy)
    except FerryError as e:
        return f"✖ Not applied. {e}"
    note = (
        " The quantization preset takes effect when a model is next loaded."
        if settings.quant_preset != "none"
        else ""
    )
    return "✔ " + "; ".join(lines) + "." + note


def load_form(ctx: PanelContext) -> list[Any]:
    """The page's initial values: the saved settings, the slider bounded by the model."""
    try:
        settings = ctx.load()
        msg = f"Settings file: `{ctx.settings_path}`"
    except FerryError as e:
        from ...offload_core.tools.settings_file import PanelSettings

        settings = PanelSettings()
        msg = f"✖ The settings file `{ctx.settings_path}` is invalid ({e}); showing defaults. Save to replace it."
    form = form_from_settings(settings)
    top = ctx.max_blocks()
    blocks = gr.Slider(minimum=1, maximum=top, step=1, value=min(int(form.blocks_per_group), top))
    return [*form._replace(blocks_per_group=blocks), msg]


def _model_widgets(ctx: PanelContext) -> list[Any]:
    """How the model is cut and where it waits (left column): level, blocks, tier, folder."""
    level = gr.Radio(
        level_choices(block="Groups of blocks (recommended)"),
        value=DEFAULTS["level"], label="How to cut the model", elem_id="ferry-level",
        info="A block is one of the model's repeated stages (a transformer block).",
    )  # fmt: skip
    blocks = gr.Slider(
        1, ctx.max_blocks(), value=DEFAULTS["blocks_per_group"], step=1, label="Blocks moved together",
        info="More blocks at once: faster, but needs more VRAM. Fewer: less VRAM.",
        elem_id="ferry-blocks",
    )  # fmt: skip
    tier = gr.Radio(
        tier_choices(), value=DEFAULTS["tier"], label="Where the rest of the model waits",
        elem_id="ferry-tier",
        info="Disk needs almost no RAM, and a fast SSD keeps it quick.",
    )  # fmt: skip
    disk_path = gr.Textbox(
        label="Disk folder (for the disk tier)", placeholder="/mnt/nvme/ferry",
        info="A folder on your fastest disk. Ferry writes its files there and deletes them after.",
        elem_id="ferry-disk-path",
    )  # fmt: skip
    return [level, blocks, tier, disk_path]


def _memory_widgets(ctx: PanelContext) -> list[Any]:
    """How much runs on the GPU (right column): look-ahead, budget, headroom, quantization."""
    prefetch = gr.Slider(
        1, 8, value=DEFAULTS["prefetch_depth"], step=1, label="Look-ahead (groups loaded in advance)",
        info="2 or more can hide slow disks; each one costs a little more VRAM.",
        elem_id="ferry-prefetch",
    )  # fmt: skip
    vram_budget = gr.Textbox(
        label="VRAM budget (GiB)", placeholder="empty = stream everything; 'auto' = use what is free",
        info="Ferry keeps as much of the model on the GPU as this allows.", elem_id="ferry-vram-budget",
    )  # fmt: skip
    headroom = gr.Number(
        value=DEFAULTS["headroom_gb"], label="Headroom for 'auto' (GiB)", minimum=0,
        info="VRAM left free for the image itself (activations, VAE).", elem_id="ferry-headroom",
    )  # fmt: skip
    quant = gr.Dropdown(
        quant_choices(ctx.onload_device), value="none", label="Quantization",
        info="Smaller weights move faster and need less memory, at a small cost in quality.",
        elem_id="ferry-quant",
    )  # fmt: skip
    return [prefetch, vram_budget, headroom, quant]


def _advanced_disk_widgets() -> list[Any]:
    """The disk tier's rarer options, folded away: the defaults suit almost every machine."""
    with gr.Accordion("Advanced (disk tier)", open=False, elem_id="ferry-advanced"):
        direct_io = gr.Checkbox(
            value=DEFAULTS["direct_io"], label="Unbuffered reads (skip the page cache)", elem_id="ferry-direct-io",
            info="O_DIRECT: no page-cache copy, so the cache stays free for the rest of the machine. Off: "
            "buffered reads, faster only when the group files fit in RAM anyway.",
        )  # fmt: skip
        verify = gr.Radio(
            [("Once per group (first read)", "first_read"), ("Every read", "every_read")],
            value=DEFAULTS["verify"], label="Verify checksums", elem_id="ferry-verify",
            info="Every read: catches a disk that corrupts data later, at some CPU cost.",
        )  # fmt: skip
        cpu_read = gr.Radio(
            [
                ("Automatic (copy unless RAM is short)", "auto"),
                ("Map the files (no copy)", "mapped"),
                ("Copy into a buffer", "copy"),
            ],
            value=DEFAULTS["cpu_read"], label="On a CPU-only machine", elem_id="ferry-cpu-read",
            info="Copy is faster; mapped computes from the files' page cache with almost no RAM. "
            "On a GPU groups are always copied.",
        )  # fmt: skip
    return [direct_io, verify, cpu_read]


def _wire(ctx: PanelContext, demo: gr.Blocks, form: list[Any], view: dict[str, Any]) -> None:
    """The events: preview on every change, the disk check as typed, Save, Apply, page load."""
    plot, summary, status = view["plot"], view["summary"], view["status"]
    for i, w in enumerate(form):
        # One public endpoint (the first) for API users; the rest are the same call, private.
        w.change(lambda *v: preview(ctx, *v), inputs=form, outputs=[plot, summary],
                 api_name="plan_preview" if i == 0 else None,
                 show_progress="hidden", trigger_mode="always_last",
                 **(public_api() if i == 0 else private_api()))  # fmt: skip
    disk_path, disk_status = view["disk_path"], view["disk_status"]
    disk_path.input(lambda p: check_disk(ctx, p), inputs=disk_path, outputs=disk_status,
                    api_name="check_disk", show_progress="hidden", trigger_mode="always_last")  # fmt: skip
    disk_path.change(lambda p: check_disk(ctx, p), inputs=disk_path, outputs=disk_status,
                     show_progress="hidden", **private_api())  # fmt: skip
    view["save"].click(
        lambda *v: save(ctx, *v), inputs=form, outputs=status, api_name="save_settings"
    )
    view["apply"].click(
        lambda *v: apply(ctx, *v), inputs=form, outputs=status, api_name="apply_settings"
    )
    # The preview is drawn once the saved values are in (a value set to what it already was
    # fires no change event).
    demo.load(lambda: load_form(ctx), outputs=[*form, view["file_note"]], api_name="load_settings").then(
        lambda *v: preview(ctx, *v), inputs=form, outputs=[plot, summary], show_progress="hidden",
        **private_api(),
    )  # fmt: skip


def build_settings_tab(ctx: PanelContext, demo: gr.Blocks) -> list[Any]:
    """Builds the tab; returns the form widgets (``Form`` order) for the planner to fill."""
    gr.Markdown(
        "Ferry keeps only part of the model on the GPU and streams the rest in just before it "
        "is needed. These settings choose how. **Save** writes them to the settings file: "
        f"{ctx.saved_note} {ctx.apply_note}",
        elem_id="ferry-settings-intro",
    )
    view: dict[str, Any] = {"file_note": gr.Markdown(elem_id="ferry-settings-file")}
    with gr.Row():
        with gr.Column():
            model_widgets = _model_widgets(ctx)
            view["disk_status"] = gr.Markdown(elem_id="ferry-disk-check")
        with gr.Column():
            memory_widgets = _memory_widgets(ctx)
    advanced = _advanced_disk_widgets()
    with gr.Row():
        view["plot"] = gr.BarPlot(
            x="where", y="GiB", title="Where the weights will live", height=240,
            sort=[label for _, label in PLACES], elem_id="ferry-plan-plot",
        )  # fmt: skip
        view["summary"] = gr.Markdown(elem_id="ferry-plan-summary")
    with gr.Row():
        view["save"] = gr.Button("Save", variant="primary", elem_id="ferry-save")
        view["apply"] = gr.Button("Apply to loaded models", elem_id="ferry-apply")
    view["status"] = gr.Markdown(elem_id="ferry-settings-status")
    view["disk_path"] = model_widgets[3]
    form: list[Any] = [*model_widgets, *memory_widgets, *advanced]
    _wire(ctx, demo, form, view)
    return form
