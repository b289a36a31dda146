"""The "Ferry offload" accordion's **Plan** button (and ``GET /ferry/plan``): offload_core's
planner (the one ComfyUI's "auto" settings and pre-flight use) run on the checkpoint Forge
has loaded, said in Markdown, with the same plan a generation with these controls, Steps and
CFG takes its "auto" from (webui/auto_plan.py).

Nothing loads and nothing moves. The caller passes the loaded model (webui/entry.py: Forge's
``model_data.sd_model``, never ``shared.sd_model``, which loads one when none is), so CI
tests this on stand-ins.

Two plans are shown: what Ferry would choose for each network (every setting "auto"), each
choice with the planner's sentence; then the accordion's own settings, with what its "auto"
controls resolve to and whether they fit, the planner's warning or refusal naming the control
to change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..offload_core import ConfigError
from ..offload_core.planner import GraphPlan, Wish
from ..offload_core.units import fmt_bytes
from .auto_plan import (
    DEFAULT_CFG,
    DEFAULT_STEPS,
    loaded_networks,
    plan_for,
    sampling,
    title_of,
    unet_reads,
)
from .controls import (
    CONTROLS,
    LABELS,
    Asked,
    ControlError,
    as_control_error,
    asked_from_controls,
    controls_dict,
    describe,
)

NO_CHECKPOINT = (
    "Ferry: no checkpoint is loaded, so there is nothing to plan. Choose one in the Checkpoint "
    "menu (or generate once), then press Plan again: Plan never loads a model itself."
)
TEXT_ENCODER_OFF = f"The text encoder is Forge's own: tick *{LABELS['text_encoder']}* to plan it."
AUTO_NOTE = "auto: the planner's choice, as a generation with these settings runs it"


def settings_of(values: tuple[Any, ...] | list[Any], **kw: Any) -> tuple[Asked | None, str | None]:
    """The accordion's settings as if it were on (or None and the error naming the
    control), so Plan checks them before the accordion is switched on."""
    try:
        c = controls_dict(values)
        on = [True, *(c[cid] for cid, _ in CONTROLS[1:])]
        return asked_from_controls(on, **kw), None
    except ControlError as e:
        return None, str(e)


def _choice_lines(title: str, plan: GraphPlan, i: int) -> list[str]:
    c = plan.choices[i]
    n = c.network
    return [
        f"**{title}** ({n.name}, {fmt_bytes(n.nbytes)}): **{c.tier}**, "
        f"{c.blocks_per_group} block(s) per group, look-ahead {c.prefetch_depth}.  ",
        f"Why: {c.reason}.",
        "",
    ]


def _verdict(plan: GraphPlan, from_saved: bool) -> str:
    if plan.refusal is not None:  # named by the accordion's control, not the setting
        return f"does not fit: {as_control_error(plan.refusal, saved=from_saved)}"
    return plan.verdict()


def plan_answer(
    sd_model: Any,
    values: tuple[Any, ...] | list[Any],
    *,
    default_disk_path: str,
    load_saved: Callable[[], Any],
    steps: Any = DEFAULT_STEPS,
    cfg_scale: Any = DEFAULT_CFG,
) -> dict[str, Any]:
    """``{"text": the Plan button's Markdown, "networks": [...]}`` for ``sd_model`` (Forge's
    loaded model, or None), the accordion's ``values`` (in ``CONTROLS`` order) and the Steps
    and CFG Scale sliders; ``networks``: per network, the settings a generation with these
    controls would run (auto resolved), empty where they are not usable. Never raises for a
    setting: it is said."""
    c = controls_dict(values) if len(values) <= len(CONTROLS) else {}
    nets = loaded_networks(sd_model, c.get("text_encoder") is True)
    if nets is None:
        return {"text": NO_CHECKPOINT, "networks": []}
    steps, cfg_scale = sampling(steps, cfg_scale)
    reads = unet_reads(steps, cfg_scale)
    asked, error = settings_of(values, default_disk_path=default_disk_path, load_saved=load_saved)
    # What Ferry would choose: the same figures with every setting left to the planner.
    base = asked or Asked(Wish(), disk_path=default_disk_path)
    auto = plan_for(sd_model, nets, replace(base, wish=Wish()), reads)
    lines = ["### What Ferry would choose (nothing was loaded or moved to plan it)", ""]
    for i, (kind, _) in enumerate(nets):
        lines += _choice_lines(title_of(kind), auto, i)
    if c.get("text_encoder") is not True:
        lines += [TEXT_ENCODER_OFF, ""]
    lines += [f"Predicted: {auto.verdict()}.", "", _reads_line(steps, cfg_scale, reads), ""]
    lines += ["### The accordion's settings", ""]
    if asked is None:
        return {"text": "\n".join([*lines, f"Not usable: {error}"]), "networks": []}
    mine = plan_for(sd_model, nets, asked, reads)
    try:
        policies = [(title_of(k), asked.policy(mine.choices[i])) for i, (k, _) in enumerate(nets)]
    except ConfigError as e:
        error = str(as_control_error(e, saved=asked.from_saved))
        return {"text": "\n".join([*lines, f"Not usable: {error}"]), "networks": []}
    if asked.planned:  # each network's own, said with the auto that chose it
        said = "; ".join(f"{t}: {describe(p)}" for t, p in policies) + f" ({AUTO_NOTE})"
    else:
        said = describe(policies[0][1])
    on = "" if c.get("enabled") is True else " (the accordion is off: Forge loads it its own way)"
    lines.append(f"{said}{on}: {_verdict(mine, asked.from_saved)}.")
    networks = [{"title": t, **_settings(p)} for t, p in policies]
    return {"text": "\n".join(lines), "networks": networks}


def _reads_line(steps: int, cfg_scale: float, reads: float) -> str:
    """Which generation the plan is for: the planner weighs the UNet by its reads."""
    passes = "one pass a step" if cfg_scale == 1.0 else "two passes a step"
    return (
        f"Planned for {steps} steps at CFG {cfg_scale:g} ({passes}, the Steps and CFG Scale "
        f"set here): the UNet is read {reads:g} times a generation."
    )


def _settings(policy: Any) -> dict[str, Any]:
    d = policy.to_dict()
    keys = ("level", "blocks_per_group", "tier", "prefetch_depth")
    return {k: d[k] for k in keys}


def plan_text(sd_model: Any, values: tuple[Any, ...] | list[Any], **kw: Any) -> str:
    """The Plan button's Markdown (``plan_answer``'s text)."""
    return str(plan_answer(sd_model, values, **kw)["text"])
