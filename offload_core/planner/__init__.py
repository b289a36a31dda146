"""The whole-graph planner: each network of a prompt gets a tier, a group size and a
look-ahead chosen from this machine's figures, each said in one sentence (choose.py)."""

from .apply import with_choice
from .choose import Choice, GraphPlan, plan_graph
from .facts import MachineFacts, NetworkFacts, Wish

__all__ = [
    "Choice", "GraphPlan", "MachineFacts", "NetworkFacts", "Wish", "plan_graph", "with_choice",
]  # fmt: skip
