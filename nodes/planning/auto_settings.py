"""The planner's choice for a Ferry offload node's network, planned with the whole prompt
(graph_plan.py), and a choice the user forced that cannot work refused before any work. The
choice stays a typed value: NodeSettings.policy applies it (config.py).

The node gets the queued prompt and its own id from ComfyUI (V3 hidden inputs). Where it has
none (a prompt built in code without them) or its network is not found in the prompt (a
loader the planner does not know), it plans its own network alone, from the network in hand.
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
from ..input_error import NodeInputError, as_node_error
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


def _held(in_hand: Callable[[], NetworkFacts]) -> int:
    """The bytes the node's network already holds in RAM (0 where it holds none: a network
    waiting in its file, or an input with no network)."""
    try:
        return in_hand().held_bytes
    except NodeInputError:
        return 0


def planned_choice(
    hidden: Any,
    settings: NodeSettings,
    in_hand: Callable[[], NetworkFacts],
    default_folder: str,
) -> Choice | None:
    """The planner's choice for the node's network (None where nothing was planned: no
    prompt shows it and nothing is on "auto"). A plan that refuses raises NodeInputError
    naming the widget."""
    prompt = getattr(hidden, "prompt", None)
    node_id = getattr(hidden, "unique_id", None)
    choice = None
    try:
        if isinstance(prompt, dict) and node_id is not None:
            node = str(node_id).split(".")[0]
            planned = graph_plan.plan_once(
                prompt,
                held=lambda: {node: _held(in_hand)},
                default_folder=default_folder,
                budgets=budgets(),
                panel_wish=panel_wish(),
            )
            planned.plan.check()
            choice = planned.choice_for(node)
        if choice is None and settings.auto:
            net = replace(in_hand(), wish=settings.wish)
            machine = graph_plan.host_machine(settings.disk_folder(default_folder), budgets())
            choice = plan_graph(machine, [net]).check().choices[0]
            log.info("ferry plan: %s: %s", net.title, choice.reason)
    except ConfigError as e:
        raise as_node_error(e) from None
    return choice


__all__ = ["NodeInputError", "budgets", "network_in_hand", "planned_choice"]
