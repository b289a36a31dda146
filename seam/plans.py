"""Plans of one network for any policy, drawn without moving a weight.

``plan_offload`` validates a policy against a network and sizes every group; it refuses a
network that is laid out already. So whoever shows or checks a plan while the network is (or
may be) laid out plans on its *meta twin*: the same modules, every tensor on the meta device,
no memory. Both hosts' live layouts (seam/live_layout.py) and the panel's previews plan here.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from ..offload_core import plan_offload
from ..offload_core.model.plan import OffloadPlan
from ..offload_core.policy import OffloadPolicy


def meta_twin(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose tensors are on the meta device: same structure, no memory.

    Call it while the model is plain (before it is offloaded): an offloaded model's
    parameters are Ferry's slots, not the model's weights.
    """
    memo: dict[int, Any] = {}
    for t in (*model.parameters(), *model.buffers()):
        mt = torch.empty_like(t, device="meta")
        memo[id(t)] = (
            nn.Parameter(mt, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else mt
        )
    return copy.deepcopy(model, memo)


class Plans:
    """The plans drawn on one network (``basis``), one per (policy, device), cached: a plan
    is a walk over every tensor, and hosts ask for the same one at every load."""

    def __init__(self, basis: nn.Module) -> None:
        self.basis = basis
        self._cache: dict[tuple[OffloadPolicy, str], OffloadPlan] = {}

    @classmethod
    def on_twin(cls, module: nn.Module) -> Plans:
        """Plans drawn on ``module``'s meta twin (``module`` must be plain now)."""
        return cls(meta_twin(module))

    def cached(self, policy: OffloadPolicy, device: torch.device | str) -> OffloadPlan | None:
        return self._cache.get((policy, str(device)))

    def remember(
        self, policy: OffloadPolicy, device: torch.device | str, plan: OffloadPlan
    ) -> None:
        self._cache[(policy, str(device))] = plan

    def plan(
        self,
        policy: OffloadPolicy,
        device: torch.device | str,
        *,
        budget: OffloadPolicy | None = None,
    ) -> OffloadPlan:
        """The plan of ``policy`` on ``device`` (validates everything; moves nothing).
        ``budget`` is ``policy`` with a host's "auto" budget resolved, where it has one: the
        plan is drawn with it and cached under ``policy``."""
        plan = self.cached(policy, device)
        if plan is None:
            plan = plan_offload(self.basis, budget or policy, onload_device=device)
            self.remember(policy, device, plan)
        return plan
