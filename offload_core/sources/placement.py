"""A model's layout as it stands: where each group's bytes wait, and Ferry's files for them.

One ``Placement`` for every model; where the bytes come from is its ``origin`` (origin.py: the
model's own tensors, or a meta-built model's checkpoint). Three jobs work on it, each in its own
file: laying the groups out (lay_out.py), rewriting a damaged group file under the engine
(repair_group.py), and giving the weights back or dropping them when the layout ends
(give_back.py). What they share is here: the groups' runtimes, the tensors moved outside the
groups, the disk tier's store and mappings, and the group files' sources (what the source
kinds in kinds.py ask, and a repair asks again).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import nn

from ..disk.file_source import FileSource
from ..disk.mapped import MappedSource, can_map
from ..disk.mappings import Mappings
from ..disk.plan import ReadPlan
from ..disk.store import GroupStore
from ..model.grouping import GroupSpec
from ..model.layout import Entry
from ..model.plan import OffloadPlan
from ..policy import DiskTier, Tier
from ..runtime.group import GroupRuntime
from ..transfer.backend import Backend
from .kinds import Made
from .origin import Origin
from .resident import ResidentGroup

META = torch.device("meta")


class Placement:
    """A model's groups on their sources: what a layout made, until it ends."""

    def __init__(
        self, model: nn.Module, plan: OffloadPlan, backend: Backend, name: str, origin: Origin
    ) -> None:
        self.model = model
        self.plan = plan
        self.tier: Tier = plan.policy.tier
        self.backend = backend
        self.name = name
        self.origin = origin
        self.runtimes: list[GroupRuntime | ResidentGroup] = []  # every group, in order
        self.outside_moved: list[tuple[nn.Module, str, bool, torch.device]] = []
        self.store: GroupStore | None = None
        self.notes: list[str] = []
        self.mappings = Mappings()  # the files the groups' host forms view
        self.cpu_read: Literal["mapped", "copy"] = "copy"

    @property
    def streamed(self) -> list[GroupRuntime]:
        return [rt for rt in self.runtimes if isinstance(rt, GroupRuntime)]

    # -- what the source kinds ask (sources/kinds.py: Placing), and a repair again -----------
    def write_group(
        self, spec: GroupSpec, packed: torch.Tensor, let_go: Callable[[], None] | None = None
    ) -> ReadPlan:
        """The group's file (``let_go``: see GroupStore.write_group), read as the tier says."""
        assert self.store is not None and isinstance(self.tier, DiskTier)
        plan = self.store.write_group(spec.index, spec.entries, packed, let_go)
        plan.verify_every_read = self.tier.verify == "every_read"
        return plan

    def group_file_source(self, spec: GroupSpec, plan: ReadPlan) -> Made:
        forms = self.mappings.group_forms(spec.entries, plan)
        if self.backend.synchronous and self.cpu_read == "mapped" and can_map():
            return MappedSource(plan, self.mappings.of(plan)), forms
        return FileSource(plan), forms

    def checkpoint_forms(self, spec: GroupSpec, plan: ReadPlan) -> list[torch.Tensor]:
        """Views of the file's mapping: the group's tensors while it is not computing (the
        model reads as usual; nothing is in RAM until touched)."""
        return self.mappings.checkpoint_forms(spec.entries, plan)


def point_all(entries: list[Entry], forms: list[torch.Tensor]) -> None:
    """Each entry's module at its form: a tensor that waits in its file (meta) is replaced,
    any other keeps its object (``Entry.point_at``)."""
    for e, f in zip(entries, forms):
        if e.orig_device == META:
            e.put(f)
        else:
            e.point_at(f)


def move_tensor(m: nn.Module, attr: str, is_param: bool, dev: torch.device) -> None:
    """A tensor outside the groups moved to ``dev`` (the layout's device, or back home)."""
    table = m._parameters if is_param else m._buffers
    t = table[attr]
    assert t is not None
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if is_traceable_wrapper_subclass(t):
        moved = t.to(dev)
        if is_param:
            torch.utils.swap_tensors(t, nn.Parameter(moved, requires_grad=t.requires_grad))
        else:
            table[attr] = moved
    else:
        t.data = t.data.to(dev)
