"""A network's figures from the module itself, where no file tells them (a host's network
built in code, a prompt's network the planner found no loader for, a Forge model already
loaded, the panel's demo model): its bytes as held and its block lists' blocks as
model/grouping.py finds them, each tensor by stored_sizes.py's table (a quantized tensor by its
inner tensors, its largest layer's dequantized copy as the transient). A meta module counts by
its shapes, so nothing needs to be in memory."""

from __future__ import annotations

import torch
from torch import nn

from ..model.grouping import find_block_lists
from ..model.layout import module_nbytes
from .facts import Kind, NetworkFacts
from .stored_sizes import held_tensor


def network_from_module(
    module: nn.Module,
    name: str,
    kind: Kind,
    *,
    reads_per_prompt: float = 1.0,
    compute: torch.dtype | None = None,
) -> NetworkFacts:
    """``module``'s figures; ``held_bytes`` are its tensors already in this process's RAM.
    ``compute``: the dtype its quantized layers are dequantized to (None: the dtype a
    quantized tensor says it computes in, float32 for a GGUF or fp8 one)."""
    lists = find_block_lists(module)
    blocks = tuple(module_nbytes(b) for _, bl in lists for b in bl.children())
    unique = {id(t): t for t in (*module.parameters(), *module.buffers())}
    held = {i: held_tensor(t, compute) for i, t in unique.items()}
    layers = [
        sum(held[id(t)].dequant_bytes for t in m.parameters(recurse=False) if id(t) in held)
        for m in module.modules()
    ]
    return NetworkFacts(
        name,
        kind,
        sum(h.nbytes for h in held.values()),
        blocks,
        reads_per_prompt=reads_per_prompt,
        held_bytes=sum(held[i].nbytes for i, t in unique.items() if t.device.type == "cpu"),
        longest_list=max((len(list(bl.children())) for _, bl in lists), default=0),
        transient_bytes=max(layers, default=0),
    )
