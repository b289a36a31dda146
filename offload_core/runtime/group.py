"""One streamed group at run time: its spec, its source, and which forms its tensors take."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..model.grouping import GroupSpec
from ..model.layout import Entry
from .source import WeightSource

if TYPE_CHECKING:
    from ..transfer.buffers import Slot

#: Device forms kept per entry, by region offset (rebuilding a torchao wrapper costs ~90 us).
FORMS_KEPT = 8


class GroupRuntime:
    def __init__(
        self, spec: GroupSpec, source: WeightSource, host_forms: list[torch.Tensor]
    ) -> None:
        self.spec = spec
        self.source = source
        self.host_forms = host_forms  # what each entry points at while offloaded
        self._forms: list[torch.Tensor] = []  # the forms they point at in a slot (the
        # engine's current Load says which slot)
        self._held: list[torch.Tensor] = []  # the tensor objects the module held in the slot
        self.requires_grad = any(e.requires_grad for e in spec.entries)

    @property
    def name(self) -> str:
        return self.spec.name

    def to_slot(self, slot: Slot) -> None:
        self._forms = [_form_at(e, slot) for e in self.spec.entries]
        for e, form in zip(self.spec.entries, self._forms):
            e.point_at(form)
        self._held = [e.current() for e in self.spec.entries]

    def to_host(self) -> None:
        for e, host, form, held in zip(self.spec.entries, self.host_forms, self._forms, self._held):
            # A forward that put a new tensor in the module's place (Forge's GGUF and bnb
            # Linears replace a bias whose dtype is not the input's by a cast copy, and keep
            # it) leaves the slot with the object Ferry placed: that object goes back, and the
            # next forward makes its copy again, from the same bytes.
            e.hold(held)
            # A subclass went to the slot by swapping with the slot form, which has held the
            # host form since; swapping again restores both.
            e.point_at(host if e.subclass is None else form)
        self._forms = []
        self._held = []


def _form_at(e: Entry, slot: Slot) -> torch.Tensor:
    """The entry's device form around ``slot``, from its cache (by region offset; a group's
    offsets repeat with the forward's pattern), which keeps the ``FORMS_KEPT`` latest."""
    form = e.slot_forms.pop(slot.offset, None)
    if form is None:
        form = e.build(slot.buf)
    e.slot_forms[slot.offset] = form  # the newest last
    if len(e.slot_forms) > FORMS_KEPT:
        del e.slot_forms[next(iter(e.slot_forms))]
    return form
