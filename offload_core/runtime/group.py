"""One streamed group at run time: its spec, its source, and which forms its tensors take."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..model.grouping import GroupSpec
from ..sources.base import WeightSource

if TYPE_CHECKING:
    from ..transfer.buffers import Slot


class GroupRuntime:
    def __init__(
        self, spec: GroupSpec, source: WeightSource, host_forms: list[torch.Tensor]
    ) -> None:
        self.spec = spec
        self.source = source
        self.host_forms = host_forms  # what each entry points at while offloaded
        self.slot: Slot | None = None  # the slot its tensors point into right now
        self.requires_grad = any(e.requires_grad for e in spec.entries)

    @property
    def name(self) -> str:
        return self.spec.name

    def to_slot(self, slot: Slot) -> None:
        for e in self.spec.entries:
            form = e.slot_forms.get(slot.index)
            if form is None:
                form = e.slot_forms[slot.index] = e.build(slot.buf)
            e.point_at(form)
        self.slot = slot

    def to_host(self) -> None:
        slot = self.slot
        assert slot is not None
        for e, host in zip(self.spec.entries, self.host_forms):
            # A subclass went to the slot by swapping with the slot form, which has held the
            # host form since; swapping again restores both.
            e.point_at(host if e.subclass is None else e.slot_forms[slot.index])
        self.slot = None
