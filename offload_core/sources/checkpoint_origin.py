"""A meta-built model placed straight from its checkpoint: models bigger than RAM.

The origin ``Placement`` is given by ``load_offloaded`` (sources/origin.py says what an
origin is):
- each group's slab is filled from the checkpoint (``CheckpointWeights.fill_group``): the
  device buffer of a resident group (through one host slab of its size), the host slab of the
  RAM tiers (the model once, never twice), or for the disk tier one reused scratch slab;
- on the disk tier a group read verbatim keeps the checkpoint as its source (nothing
  written; its CRCs come from the bytes just read); a converted group (a dtype cast, a baked
  patch) is written to Ferry's group file, so one converted group at a time is in RAM;
- the tensors outside the groups are read from the file straight to the onload device.
Remove (or a failed build) puts every tensor back on the meta device: the checkpoint is the
source of truth, and a model bigger than RAM must never be rebuilt in RAM to be let go.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch
from torch import nn

from ..disk.plan import ReadPlan
from ..model.grouping import GroupSpec
from ..model.layout import Entry, put_tensor
from ..model.plan import OffloadPlan
from ..runtime.memory import trim_heap
from .checkpoint_stream import CheckpointWeights

META = torch.device("meta")


class CheckpointOrigin:
    """The checkpoint as every tensor's origin and home (they go back to meta on remove)."""

    def __init__(self, weights: CheckpointWeights) -> None:
        self.weights = weights
        self._from_file: set[int] = set()  # groups every tensor of which came from the file
        self._outside: list[tuple[nn.Module, str, bool]] = []

    def opened(self, plan: OffloadPlan, notes: list[str]) -> AbstractContextManager[object]:
        return self.weights

    def verbatim(self, entries: list[Entry]) -> bool:
        return self.weights.reads_verbatim(entries)

    def fill(self, spec: GroupSpec, buf: torch.Tensor) -> bool:
        if all(e.current().device == META for e in spec.entries):
            self._from_file.add(spec.index)
        if buf.device.type == "cpu":
            verbatim = self.weights.fill_group(spec, buf)
        else:  # a resident group on an accelerator: through one host slab of its size
            host = torch.empty(spec.nbytes, dtype=torch.uint8)
            verbatim = self.weights.fill_group(spec, host)
            buf.copy_(host)
        if not verbatim:
            # A conversion's temporaries (a cast copy, torchao's 4-8x per slice) are freed
            # below glibc's mmap threshold: hand their pages back before the next group.
            trim_heap()
        for e in spec.entries:
            e.orig_device = META  # where remove() puts it back (see the module's docstring)
        return verbatim

    def read_plan(
        self, spec: GroupSpec, packed: torch.Tensor, verbatim: bool, direct: bool
    ) -> ReadPlan | None:
        if not verbatim:
            return None
        return _verified(self.weights.read_plan(spec, packed, direct))

    # -- repair: the checkpoint is the source of truth (disk/repair.py) ------------------------
    def has_truth(self, spec: GroupSpec) -> bool:
        return spec.index in self._from_file

    def refill(self, spec: GroupSpec, buf: torch.Tensor) -> None:
        """The group's slab as it was laid out, read again from the checkpoint."""
        with self.weights:
            for e in spec.entries:
                self.weights.fill_entry(e, buf)

    def truth_name(self) -> str:
        return self.weights.name

    # -- the tensors outside the groups --------------------------------------------------------
    def place_outside(self, model: nn.Module, plan: OffloadPlan) -> None:
        """The tensors outside the groups, read from the file onto the onload device."""
        seen: set[int] = set()
        for m, attr, is_param in plan.grouping.resident:
            table = m._parameters if is_param else m._buffers
            t = table[attr]
            if t is None or id(t) in seen:
                continue
            seen.add(id(t))
            if t.device != META:
                continue
            real = self.weights.read_tensor(_qualname(model, m, attr), t).to(plan.device)
            put_tensor(table, attr, is_param, real, t.requires_grad)
            if is_param:
                _retie(model, t, table[attr])  # type: ignore[arg-type]
            self._outside.append((m, attr, is_param))

    def restore_outside(self) -> None:
        for m, attr, is_param in reversed(self._outside):
            table = m._parameters if is_param else m._buffers
            t = table[attr]
            assert t is not None
            put_tensor(table, attr, is_param, t.to(META), t.requires_grad)
        self._outside.clear()


def _verified(plan: ReadPlan) -> ReadPlan:
    plan.verified = True  # its CRCs are those of the bytes just read from the file
    return plan


def _qualname(model: nn.Module, owner: nn.Module, attr: str) -> str:
    for name, m in model.named_modules(remove_duplicate=False):
        if m is owner:
            return f"{name}.{attr}" if name else attr
    raise KeyError(attr)


def _retie(model: nn.Module, old: torch.Tensor, new: nn.Parameter) -> None:
    """A weight tied between modules outside the groups stays one tensor."""
    for m in model.modules():
        for k, v in m._parameters.items():
            if v is old:
                m._parameters[k] = new
