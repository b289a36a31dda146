"""One owner for every control's default and choices: offload_core/control_defaults.py
(``CONTROL_DEFAULTS``) beside policy.py (``VERIFY_MODES``, ``CPU_READS``). ComfyUI's widgets, Forge's accordion
and the panel's form start from it; the values are the ones each host showed before the table
(saved workflows, templates and infotext carry their own values: tests/test_templates.py)."""

from __future__ import annotations

import importlib
from typing import Any, get_args, get_type_hints

from offload_core.control_defaults import PLANNED_SETTINGS, control_defaults
from offload_core.policy import AUTO, CPU_READS, VERIFY_MODES, DiskTier
from tests.conftest import PACK_NAME, load_pack
from tests.node_schemas import node_schemas, widgets

#: Each host's defaults before the table (main at cf89b8d): nothing a user sees changes.
COMFYUI_BEFORE = {
    "level": "block", "blocks_per_group": AUTO, "tier": AUTO, "disk_path": "",
    "prefetch_depth": AUTO, "vram_budget": "auto", "headroom_gb": 2.0, "direct_io": True,
    "verify": "first_read", "cpu_read": "auto", "bake_lora": "off",
}  # fmt: skip
#: Forge's accordion as a new user meets it: the planner's settings on auto (issue 46), the
#: rest as before the table.
FORGE_DEFAULTS = {
    "enabled": False, "level": "block", "blocks_per_group": "auto", "tier": "auto",
    "disk_path": "", "prefetch_depth": "auto", "vram_budget": "auto", "use_saved": False,
    "text_encoder": False,
}  # fmt: skip


def _widget_defaults(node_id: str) -> dict[str, Any]:
    return {w["name"]: w.get("default") for w in widgets(node_schemas()[node_id])}


def test_comfyui_widgets_start_from_the_table_with_the_planner_on_auto() -> None:
    shown = _widget_defaults("FerryOffloadModel")
    shown.pop("use_panel_settings")
    assert shown == control_defaults(planned=True) == COMFYUI_BEFORE
    assert {k for k, v in control_defaults(planned=True).items() if v == AUTO} >= set(
        PLANNED_SETTINGS
    )


def test_every_offload_node_shows_the_same_defaults() -> None:
    model = _widget_defaults("FerryOffloadModel")
    model.pop("bake_lora")  # the diffusion model's alone (its site bakes)
    for node_id in ("FerryOffloadTextEncoder", "FerryOffloadControlNet", "FerryOffloadClipVision"):
        assert _widget_defaults(node_id) == model, node_id


def test_the_disk_choices_are_the_tiers_own_literals() -> None:
    hints = get_type_hints(DiskTier)
    assert get_args(hints["verify"]) == VERIFY_MODES and get_args(hints["cpu_read"]) == CPU_READS
    inputs = {i["name"]: i for i in node_schemas()["FerryOffloadModel"]["inputs"]}
    assert inputs["verify"]["options"] == list(VERIFY_MODES)
    assert inputs["cpu_read"]["options"] == list(CPU_READS)


def test_forge_and_the_panel_start_from_the_table() -> None:
    load_pack()
    controls = importlib.import_module(f"{PACK_NAME}.webui.controls")
    assert controls.DEFAULTS == FORGE_DEFAULTS
    planned = control_defaults(planned=True)
    assert {k: controls.DEFAULTS[k] for k in planned if k in controls.DEFAULTS} == {
        k: v for k, v in planned.items() if k in controls.DEFAULTS
    }
    Form = importlib.import_module(f"{PACK_NAME}.web.panel.forms").Form
    form = Form("block", 1, "pinned", "", 1, "", 2.0, "none")
    assert (form.direct_io, form.verify, form.cpu_read) == (True, "first_read", "auto")
