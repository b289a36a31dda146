"""A network's figures from the module itself, where no file tells them (a host's network
built in code, a prompt's network the planner found no loader for, the panel's demo model):
its bytes and its block lists' blocks as model/grouping.py finds them. A meta module counts
by its shapes, so nothing needs to be in memory."""

from __future__ import annotations

from torch import nn

from ..model.grouping import find_block_lists
from ..model.layout import module_nbytes
from .facts import Kind, NetworkFacts


def network_from_module(
    module: nn.Module, name: str, kind: Kind, *, reads_per_prompt: float = 1.0
) -> NetworkFacts:
    """``module``'s figures; ``held_bytes`` are its tensors already in this process's RAM."""
    lists = find_block_lists(module)
    blocks = tuple(module_nbytes(b) for _, bl in lists for b in bl.children())
    held = sum(t.nbytes for t in module.parameters() if t.device.type == "cpu")
    return NetworkFacts(
        name,
        kind,
        module_nbytes(module),
        blocks,
        reads_per_prompt=reads_per_prompt,
        held_bytes=held,
        longest_list=max((len(list(bl.children())) for _, bl in lists), default=0),
    )
