"""A Ferry offload node's policy, from its parsed widgets to a checked clone: "auto" planned
for the whole prompt (auto_settings.py) and applied as a typed value, the panel's saved
settings where the node says so, and the policy validated against the network (the plan;
room in the disk folder) before any weight moves. Every offload node (offload_node.py's
FerryOffloadNode) calls these."""

from __future__ import annotations

import os
from typing import Any

import folder_paths

from ...offload_core import ConfigError, DiskTier, OffloadPolicy
from ...offload_core.planner import Choice, NetworkFacts
from ...offload_core.planner.facts import Kind
from ...offload_core.planner.group_files import plan_group_files
from ...offload_core.tools.settings_file import default_settings_path, load_settings
from ..input_error import NodeInputError, as_node_error
from ..loading.stream_loader import bytes_to_write
from .auto_settings import budgets, network_in_hand, planned_choice
from .config import ComfyOffload, NodeSettings, check_disk_folder, policy_from_panel


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
    settings: NodeSettings | None,
    network: Any,
    name: str,
    kind: Kind = "model",
) -> tuple[OffloadPolicy, Choice | None]:
    """The policy a Ferry offload node runs with, and the planner's choice (None where
    nothing was planned): the panel's saved settings (``settings`` None: use_panel_settings
    is on), or the node's ``settings`` (its widgets, parsed) with every "auto" filled by the plan of the whole prompt
    (auto_settings.py) as a typed value. Raises NodeInputError naming the widget."""
    if settings is None:
        return policy_from_panel(load_settings), None

    def in_hand() -> NetworkFacts:
        if network is None:
            raise NodeInputError("tier", "this input holds no network to plan; choose a tier")
        return network_in_hand(network, name, kind)

    settings = settings.with_vram_cap(budgets()[0])
    choice = planned_choice(hidden, settings, in_hand, default_disk_path())
    return settings.policy(choice, default_disk_path()), choice


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
