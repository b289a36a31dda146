"""What a Ferry offload node's plan reads besides its prompt (offload_policy.py plans the
prompt, graph_plan.py): the budgets and the panel's wish saved in the settings file, the
network in hand and what it holds in RAM; and the plan of that network alone, for a node
whose prompt does not show it (no hidden inputs, or a loader the planner does not know).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ...offload_core import ConfigError
from ...offload_core.planner import Choice, NetworkFacts, Wish, plan_graph
from ...offload_core.planner.facts import Kind
from ...offload_core.planner.network_module import network_from_module
from ...offload_core.tools.settings_file import load_settings
from ..input_error import NodeInputError
from . import graph_plan
from .config import NodeSettings

log = logging.getLogger("ferry")


def budgets() -> tuple[int | None, int | None]:
    """The (VRAM, RAM) budgets saved in the settings file (the sidebar, the panel, the
    /ferry/budgets route): read at each prompt, so a change applies from the next one."""
    try:
        s = load_settings()
    except ConfigError:
        return (None, None)  # a broken file is the panel's to report; plan without caps
    return (s.vram_budget, s.ram_budget)


def panel_wish() -> Wish:
    """What a node with use_panel_settings on asks for: the saved policy, every setting set
    (a broken file asks for nothing; the node itself reports it, naming use_panel_settings)."""
    try:
        policy = load_settings().policy
    except ConfigError:
        return Wish()
    blocks = policy.to_dict()["blocks_per_group"]
    return Wish(policy.tier_name, blocks, policy.prefetch_depth)


def network_in_hand(module: Any, name: str, kind: Kind) -> NetworkFacts:
    """The figures of the network a node holds, for a node its prompt does not show."""
    return network_from_module(module, name, kind)


def held_in_ram(in_hand: Callable[[], NetworkFacts]) -> int:
    """The bytes the node's network already holds in RAM (0 where it holds none: a network
    waiting in its file, or an input with no network)."""
    try:
        return in_hand().held_bytes
    except NodeInputError:
        return 0


def plan_alone(
    settings: NodeSettings, in_hand: Callable[[], NetworkFacts], default_folder: str
) -> Choice:
    """The planner's choice for a node's network planned by itself, from the network in hand:
    for a node with "auto" whose prompt does not show its network (a prompt built in code
    without hidden inputs, a loader the planner does not know). Raises ConfigError."""
    net = replace(in_hand(), wish=settings.wish)
    machine = graph_plan.host_machine(settings.disk_folder(default_folder), budgets())
    choice = plan_graph(machine, [net]).check().choices[0]
    log.info("ferry plan: %s: %s", net.title, choice.reason)
    return choice


__all__ = ["NodeInputError", "budgets", "held_in_ram", "network_in_hand", "plan_alone"]
