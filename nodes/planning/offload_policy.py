"""A Ferry offload node's policy, from its widgets to a checked clone: "auto" planned
for the whole prompt (graph_plan.py) and applied as a typed value, the panel's saved
settings where the node says so, and the policy validated against the network (the plan;
room in the disk folder) before any weight moves. Every offload node (offload_node.py's
FerryOffloadNode) calls these."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import folder_paths

from ...offload_core import ConfigError, DiskTier, OffloadPolicy
from ...offload_core.planner import Choice, NetworkFacts
from ...offload_core.planner.facts import Kind
from ...offload_core.planner.group_files import plan_group_files
from ...offload_core.tools.settings_file import default_settings_path, load_settings
from ..input_error import NodeInputError, as_node_error
from ..loading.stream_loader import bytes_to_write
from .auto_settings import budgets, held_in_ram, network_in_hand, panel_wish, plan_alone
from .config import ComfyOffload, NodeSettings, check_disk_folder, policy_from_panel
from .graph_plan import plan_prompt


def default_disk_path() -> str:
    # ComfyUI empties its temp folder at start, which suits files that live one session.
    return os.path.join(folder_paths.get_temp_directory(), "ferry")


def settings_fingerprint() -> tuple[str, int, int]:
    p = default_settings_path()
    try:
        st = p.stat()
    except OSError:
        return (str(p), 0, 0)
    return (str(p), st.st_mtime_ns, st.st_size)


def node_policy(
    hidden: Any,
    widgets: Mapping[str, Any] | None,
    network: Any,
    name: str,
    kind: Kind = "model",
) -> tuple[OffloadPolicy, Choice | None]:
    """The policy a Ferry offload node runs with, and the planner's choice (None where
    nothing was planned): the panel's saved settings (``widgets`` None: use_panel_settings
    is on), or the node's widgets with every "auto" filled by the planner's choice as a
    typed value. The node gets its queued prompt and id from ComfyUI (V3 hidden inputs):
    the prompt's plan (graph_plan.py, made once for the prompt) holds the node's widgets,
    parsed, and its choice; a node whose prompt does not show its network plans it alone.
    A plan that refuses raises NodeInputError naming the widget."""
    if widgets is None:
        return policy_from_panel(load_settings), None

    def in_hand() -> NetworkFacts:
        if network is None:
            raise NodeInputError("tier", "this input holds no network to plan; choose a tier")
        return network_in_hand(network, name, kind)

    prompt, node_id = getattr(hidden, "prompt", None), getattr(hidden, "unique_id", None)
    settings, choice, folder, caps = None, None, default_disk_path(), budgets()
    try:
        if isinstance(prompt, dict) and node_id is not None:
            node = str(node_id).split(".")[0]
            planned = plan_prompt(
                prompt, default_folder=folder, budgets=caps, panel_wish=panel_wish(),
                held=lambda: {node: held_in_ram(in_hand)},
            )  # fmt: skip
            planned.plan.check()
            settings, choice = planned.settings.get(node), planned.choices.get(node)
        settings = settings or NodeSettings.parse(widgets)
        if choice is None and settings.auto:
            choice = plan_alone(settings, in_hand, folder)
    except ConfigError as e:
        raise as_node_error(e) from None
    return settings.policy(choice, folder, vram_cap=caps[0]), choice


def check_against_model(out: Any, config: ComfyOffload, use_panel_settings: bool) -> None:
    """Validates the policy against this model before any weight moves: grouping, block
    count, budget, and room in the disk folder for the groups that will be written."""
    try:
        plan = out._ferry_layout().plan(config, out.load_device)
    except ConfigError as e:
        raise as_node_error(e, panel=use_panel_settings) from None
    tier = config.policy.tier
    if isinstance(tier, DiskTier):
        try:
            written = bytes_to_write(out, plan)
            if written is None:  # the run's answer, as the pre-flight's (group_files.py)
                written = plan_group_files(plan).written
            check_disk_folder(tier.path, written)
        except NodeInputError as e:
            if use_panel_settings:
                raise NodeInputError("use_panel_settings", f"the panel's {e}") from None
            raise
