"""A Ferry offload node's policy, from its widgets to a checked clone: "auto" planned for the
whole prompt (auto_settings.py), the panel's saved settings where the node says so, and the
policy validated against the network (the plan; room in the disk folder) before any weight
moves. Every offload node (offload_node.py's FerryOffloadNode) calls these."""

from __future__ import annotations

import os
from typing import Any

import folder_paths

from ...offload_core import ConfigError, DiskTier, OffloadPolicy
from ...offload_core.planner import Choice, NetworkFacts
from ...offload_core.planner.facts import Kind
from ...offload_core.tools.settings_file import default_settings_path, load_settings
from ..input_error import NodeInputError, as_node_error
from ..loading.stream_loader import bytes_to_write
from .auto_settings import network_in_hand, planned_widgets
from .config import ComfyOffload, check_disk_folder, policy_from_inputs, policy_from_panel


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


def auto_policy(
    hidden: Any,
    use_panel_settings: bool,
    widgets: dict[str, Any],
    network: Any,
    name: str,
    kind: Kind = "model",
) -> tuple[OffloadPolicy, Choice | None]:
    """The node's policy with its "auto" settings planned (auto_settings.py) for the whole
    prompt, and the planner's choice (None where nothing was planned)."""
    choice = None
    if not use_panel_settings:

        def in_hand() -> NetworkFacts:
            if network is None:
                raise NodeInputError("tier", "this input holds no network to plan; choose a tier")
            return network_in_hand(network, name, kind)

        widgets, choice = planned_widgets(hidden, widgets, in_hand, default_disk_path())
    return node_policy(use_panel_settings, **widgets), choice


def node_policy(use_panel_settings: bool, **widgets: Any) -> OffloadPolicy:
    """The policy a Ferry offload node runs with: the panel's saved settings, or its widgets'
    (validated; a bad one raises NodeInputError naming it)."""
    if use_panel_settings:
        return policy_from_panel(load_settings)
    return policy_from_inputs(default_disk_path=default_disk_path(), **widgets)


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
            check_disk_folder(tier.path, plan.offloaded_bytes if written is None else written)
        except NodeInputError as e:
            if use_panel_settings:
                raise NodeInputError("use_panel_settings", f"the panel's {e}") from None
            raise
