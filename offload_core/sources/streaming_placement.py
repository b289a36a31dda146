"""Placing a meta-built model's groups straight from its checkpoint: models bigger than RAM.

The same placement as ``Placement`` (sources/placement.py chooses each group's source), with
the bytes coming from the file instead of from the module:
- each group's slab is filled from the checkpoint (``CheckpointWeights.fill_group``): the
  device buffer of a resident group, the host slab of the RAM tiers (the model once, never
  twice), or for the disk tier one reused scratch slab;
- on the disk tier a group read verbatim keeps the checkpoint as its source (nothing written;
  its CRCs come from the bytes just read); a converted group (a dtype cast, a baked patch) is
  written to Ferry's group file, so one converted group at a time is in RAM;
- the tensors outside the groups are read from the file straight to the onload device.
Remove (or a failed build) puts every tensor back on the meta device: the checkpoint is the
source of truth, and a model bigger than RAM must never be rebuilt in RAM to be let go.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..model.grouping import GroupSpec
from ..model.layout import Entry
from ..model.plan import OffloadPlan
from ..policy import DiskTier
from ..runtime.group import GroupRuntime
from ..runtime.memory import trim_heap
from ..transfer.backend import Backend
from .checkpoint import Index
from .checkpoint_stream import CheckpointWeights, plan_from_read
from .placement import Placement, Progress
from .reads import ReadPlan

META = torch.device("meta")


class StreamingPlacement(Placement):
    def __init__(
        self,
        model: nn.Module,
        plan: OffloadPlan,
        backend: Backend,
        name: str,
        weights: CheckpointWeights,
    ) -> None:
        super().__init__(model, plan, backend, name)
        self.weights = weights
        self._verbatim: set[int] = set()  # groups whose slab is the checkpoint's bytes
        self._from_file: set[int] = set()  # groups every tensor of which came from the file
        self._outside_from_file: list[tuple[nn.Module, str, bool]] = []

    def build(self, progress: Progress | None) -> None:
        if isinstance(self.plan.policy.tier, DiskTier):
            w = self.weights
            # The checkpoint is the disk tier's source wherever its bytes are the model's.
            self._checkpoint = (w.path, w.header.entries, w.prefix)
        with self.weights:
            super().build(progress)

    def _read_checkpoint(self, path: Path) -> tuple[Path, Index, str] | None:
        return self._checkpoint  # already set from the weights; never a second index

    def _in_checkpoint(self, entries: list[Entry]) -> bool:
        return self.weights.reads_verbatim(entries)

    def _place(self, spec: GroupSpec, resident: bool, scratch: torch.Tensor | None) -> GroupRuntime:
        buf = self._slab_for(spec, resident, scratch)
        if all(e.current().device == META for e in spec.entries):
            self._from_file.add(spec.index)
        if buf.device.type == "cpu":
            verbatim = self.weights.fill_group(spec, buf)
        else:  # a resident group on an accelerator: through one host slab of its size
            host = torch.empty(spec.nbytes, dtype=torch.uint8)
            verbatim = self.weights.fill_group(spec, host)
            buf.copy_(host)
        if verbatim:
            self._verbatim.add(spec.index)
        else:
            # A conversion's temporaries (a cast copy, torchao's 4-8x per slice) are freed
            # below glibc's mmap threshold: hand their pages back before the next group.
            trim_heap()
        for e in spec.entries:
            e.orig_device = META  # where remove() puts it back (see the module's docstring)
        source, forms = self._source_for(spec, buf, resident)
        for e, f in zip(spec.entries, forms):
            _put(e, f)  # a meta tensor cannot take real data (``.data =`` refuses it)
        return GroupRuntime(spec, source, [] if resident else forms)

    # -- repair: the checkpoint is the source of truth (sources/repair.py) ---------------------
    def has_truth(self, spec: GroupSpec) -> bool:
        return spec.index in self._from_file

    def refill(self, spec: GroupSpec, buf: torch.Tensor) -> None:
        """The group's slab as it was laid out, read again from the checkpoint."""
        with self.weights:
            for e in spec.entries:
                self.weights.fill_entry(e, buf)

    def truth_name(self) -> str:
        return self.weights.path.name

    def _from_checkpoint(self, spec: GroupSpec, packed: torch.Tensor) -> ReadPlan | None:
        if spec.index not in self._verbatim or self._checkpoint is None:
            return None
        return plan_from_read(self.weights.path, spec, packed, self.weights, self._direct_io())

    def _move_outside(self) -> None:
        """The tensors outside the groups, read from the file onto the onload device."""
        dev = self.plan.device
        seen: set[int] = set()
        for m, attr, is_param in self.plan.grouping.resident:
            table = m._parameters if is_param else m._buffers
            t = table[attr]
            if t is None or id(t) in seen:
                continue
            seen.add(id(t))
            if t.device != META:
                continue
            real = self.weights.read_tensor(_qualname(self.model, m, attr), t).to(dev)
            _put_table(table, attr, is_param, real, t.requires_grad)
            if is_param:
                _retie(self.model, t, table[attr])  # type: ignore[arg-type]
            self._outside_from_file.append((m, attr, is_param))
        super()._move_outside()

    def restore_all(self) -> None:
        for m, attr, is_param in reversed(self._outside_from_file):
            table = m._parameters if is_param else m._buffers
            t = table[attr]
            assert t is not None
            _put_table(table, attr, is_param, t.to(META), t.requires_grad)
        self._outside_from_file.clear()
        super().restore_all()

    def _restore_group(self, rt: GroupRuntime) -> None:
        for e in rt.spec.entries:
            part = e.parts[0]
            _put(e, torch.empty_strided(part.size, part.stride, dtype=part.dtype, device=META))
        rt.host_forms = []
        rt.source.close(self.backend)


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


def _put(e: Entry, form: torch.Tensor) -> None:
    table = e.module._parameters if e.is_param else e.module._buffers
    _put_table(table, e.attr, e.is_param, form, e.requires_grad)


def _put_table(
    table: dict, attr: str, is_param: bool, value: torch.Tensor, requires_grad: bool
) -> None:
    if is_param:
        grad = requires_grad and value.dtype.is_floating_point
        table[attr] = nn.Parameter(value, requires_grad=grad)
    else:
        table[attr] = value
