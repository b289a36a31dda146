"""Placing a model's groups on their sources, and putting everything back.

This is the one place that decides which source a group gets (``_source_for``): a resident
device buffer under a VRAM budget, a host slab for the RAM tiers, and for the disk tier the
user's checkpoint when its bytes are the model's, else Ferry's own group file (computed from
in place, mapped, on a CPU, when ``choose_cpu_read`` says so). Weights move group by group and each group's original storage
is released as soon as its copy is in place, so the model is never twice in RAM; if anything
fails half-way, the groups already placed are put back.
"""

from __future__ import annotations

import logging
import mmap
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from ..model.grouping import GroupSpec
from ..model.layout import Entry
from ..model.plan import OffloadPlan
from ..policy import DiskTier, PinnedRamTier
from ..runtime.group import GroupRuntime
from ..runtime.memory import system_available_ram
from ..transfer.backend import Backend
from .base import WeightSource
from .checkpoint import Index, checkpoint_plan, checkpoint_spans, find_prefix, read_checkpoint_index
from .file_source import FileSource
from .host_slab import HostSlabSource
from .mapped import MappedSource, can_map
from .reads import ReadPlan, reserve_descriptors
from .repair import drop_group, in_index, lost_error, refill_from_index
from .resident import ResidentSource
from .store import GroupStore

log = logging.getLogger("ferry")
Progress = Callable[[int, int], None]
#: A group file's header, beside its data, when sizing the disk tier's folder.
HEADER_ALLOWANCE = 65536
#: cpu_read="auto" copies into slots while they take at most this share of the RAM available
#: at apply; above it RAM is the constraint and the groups are computed from the mapping.
COPY_RAM_SHARE = 0.25


def choose_cpu_read(
    asked: str, slots_bytes: int, available: int | None
) -> Literal["mapped", "copy"]:
    """The disk tier's read path on a CPU onload device.

    "auto" copies: measured on a 2-core VM (docs/benchmarks.md), computing from a reused slot
    filled by O_DIRECT reads beat computing from freshly read page cache in every regime
    (each cold forward maps new page-cache pages, which the guest faults in again). The
    mapped path holds no anonymous slots, so it is kept where the slots would take more than
    ``COPY_RAM_SHARE`` of the available RAM (or ``available`` is unknown and the platform
    maps: the safe side for RAM), and wherever it is asked for.
    """
    if asked in ("mapped", "copy"):
        return asked  # type: ignore[return-value]
    if not can_map():
        return "copy"
    if available is None or slots_bytes > available * COPY_RAM_SHARE:
        return "mapped"
    return "copy"


def available_ram() -> int | None:
    """The RAM the system could give now (psutil's "available"), None where unknown."""
    try:
        return system_available_ram()
    except (ImportError, OSError):
        return None


class Placement:
    """Moves a model's tensors onto their sources and back."""

    def __init__(self, model: nn.Module, plan: OffloadPlan, backend: Backend, name: str) -> None:
        self.model = model
        self.plan = plan
        self.backend = backend
        self.name = name
        self.runtimes: list[GroupRuntime] = []  # every group, in order
        self.outside_moved: list[tuple[nn.Module, str, bool, torch.device]] = []
        self.store: GroupStore | None = None
        self.notes: list[str] = []
        self._checkpoint: tuple[Path, Index, str] | None = None
        self._mmaps: dict[str, tuple[mmap.mmap, torch.Tensor]] = {}
        self.cpu_read: Literal["mapped", "copy"] = "copy"

    @property
    def streamed(self) -> list[GroupRuntime]:
        return [rt for rt, gp in zip(self.runtimes, self.plan.groups) if not gp.resident]

    # -- apply -------------------------------------------------------------------------------
    def build(self, progress: Progress | None) -> None:
        plan = self.plan
        groups = plan.grouping.groups
        try:
            if isinstance(plan.policy.tier, DiskTier):
                self._open_disk(plan.policy.tier)
            scratch: torch.Tensor | None = None
            for i, (spec, gp) in enumerate(zip(groups, plan.groups)):
                if isinstance(plan.policy.tier, DiskTier) and not gp.resident and scratch is None:
                    scratch = torch.empty(plan.slot_bytes, dtype=torch.uint8)
                self.runtimes.append(self._place(spec, gp.resident, scratch))
                if progress is not None:
                    progress(i + 1, len(groups))
            self._move_outside()
            if self.store is not None:
                self.store.mark_ready()
        except BaseException:
            self.restore_all()
            raise

    def _open_disk(self, tier: DiskTier) -> None:
        """Reads the checkpoint's index and claims the folder before anything moves."""
        if tier.source_checkpoint:
            self._checkpoint = self._read_checkpoint(Path(tier.source_checkpoint))
        need = sum(
            g.nbytes + HEADER_ALLOWANCE
            for g, gp in zip(self.plan.grouping.groups, self.plan.groups)
            if not gp.resident and not self._in_checkpoint(g.entries)
        )
        if self.backend.synchronous:
            self._choose_cpu_read(tier)
        # Each streamed group keeps its file open: to read, with O_DIRECT beside it
        # (sources/reads.py), and the descriptor Python's mmap keeps for its forms.
        reserve_descriptors(3 * sum(not gp.resident for gp in self.plan.groups))
        self.store = GroupStore.open(tier.path, self.name, need)
        self.store.direct_io = tier.direct_io
        if self.store.stale_note:
            log.warning("ferry: %s", self.store.stale_note)
            self.notes.append(self.store.stale_note)

    def _choose_cpu_read(self, tier: DiskTier) -> None:
        slots = self.plan.n_slots * self.plan.slot_bytes
        self.cpu_read = choose_cpu_read(tier.cpu_read, slots, available_ram())
        if tier.cpu_read == "auto":
            self.notes.append(
                f"cpu_read auto: {self.cpu_read} ({self.plan.n_slots} slots of "
                f"{self.plan.slot_bytes >> 20} MiB; see choose_cpu_read)"
            )

    def _read_checkpoint(self, path: Path) -> tuple[Path, Index, str] | None:
        index = read_checkpoint_index(path)
        names = [e.qualname for g in self.plan.grouping.groups for e in g.entries]
        prefix = find_prefix(names, index)
        if prefix is None:
            self.notes.append(
                "source_checkpoint holds none of the model's tensors: groups are written"
            )
            return None
        return path, index, prefix

    def _in_checkpoint(self, entries: list[Entry]) -> bool:
        if self._checkpoint is None:
            return False
        _, index, prefix = self._checkpoint
        return checkpoint_spans(entries, index, prefix) is not None

    def _slab_for(
        self, spec: GroupSpec, resident: bool, scratch: torch.Tensor | None
    ) -> torch.Tensor:
        """Where the group's bytes are packed: a device buffer (resident), the disk tier's
        scratch (written to a file next), or the group's own host slab."""
        if resident:
            return self.backend.empty_device(spec.nbytes)
        if scratch is not None:
            buf = scratch[: spec.nbytes]
            buf.zero_()  # padding bytes are part of the checksummed data
            return buf
        pinned = isinstance(self.plan.policy.tier, PinnedRamTier) and self.backend.can_pin
        return self.backend.empty_host(spec.nbytes, pinned=pinned)

    def _place(self, spec: GroupSpec, resident: bool, scratch: torch.Tensor | None) -> GroupRuntime:
        buf = self._slab_for(spec, resident, scratch)
        for e in spec.entries:
            e.fill(buf, e.current())
        source, forms = self._source_for(spec, buf, resident)
        for e, f in zip(spec.entries, forms):
            e.point_at(f)
        return GroupRuntime(spec, source, [] if resident else forms)

    def _source_for(
        self, spec: GroupSpec, packed: torch.Tensor, resident: bool
    ) -> tuple[WeightSource, list[torch.Tensor]]:
        """The group's source and the forms its tensors take while it does not compute."""
        tier = self.plan.policy.tier
        if resident:
            return ResidentSource(packed), [e.build(packed) for e in spec.entries]
        if not isinstance(tier, DiskTier):
            return HostSlabSource(packed), [e.build(packed) for e in spec.entries]
        read_plan = self._from_checkpoint(spec, packed)
        if read_plan is not None:
            read_plan.verify_every_read = tier.verify == "every_read"
            return FileSource(read_plan), self._file_forms(spec, read_plan, checkpoint=True)
        assert self.store is not None
        read_plan = self.store.write_group(spec.index, spec.entries, packed)
        read_plan.verify_every_read = tier.verify == "every_read"
        forms = self._file_forms(spec, read_plan, checkpoint=False)
        if self.backend.synchronous and self.cpu_read == "mapped" and can_map():
            return MappedSource(read_plan, self._mapping(read_plan)[0]), forms
        return FileSource(read_plan), forms

    def _from_checkpoint(self, spec: GroupSpec, packed: torch.Tensor) -> ReadPlan | None:
        if self._checkpoint is None:
            return None
        path, index, prefix = self._checkpoint
        return checkpoint_plan(path, spec.entries, packed, index, prefix, self._direct_io())

    def _direct_io(self) -> bool:
        """Whether reads of the user's checkpoint get an O_DIRECT descriptor (the tier's
        ``direct_io``, as for the group files)."""
        return self.store is None or self.store.direct_io

    def _mapping(self, plan: ReadPlan) -> tuple[mmap.mmap, torch.Tensor]:
        key = str(plan.path)
        if key not in self._mmaps:
            # Copy-on-write: a stray in-place write from user code never reaches the file.
            mm = mmap.mmap(plan.fd, 0, access=mmap.ACCESS_COPY)
            self._mmaps[key] = (mm, torch.frombuffer(mm, dtype=torch.uint8))
        return self._mmaps[key]

    def _file_forms(self, spec: GroupSpec, plan: ReadPlan, checkpoint: bool) -> list[torch.Tensor]:
        """Views of the file's mapping: the group's tensors while it is not computing (the
        model reads as usual; nothing is in RAM until touched)."""
        _, whole = self._mapping(plan)
        if not checkpoint:
            data = whole[plan.chunks[0].file_offset :]
            return [e.build(data) for e in spec.entries]
        assert self._checkpoint is not None
        _, index, prefix = self._checkpoint
        forms = []
        for e in spec.entries:
            t = index[prefix + e.qualname]
            part = e.parts[0]
            forms.append(whole[t.start : t.start + t.nbytes].view(part.dtype).view(part.size))
        return forms

    def _move_outside(self) -> None:
        dev = self.plan.device
        seen: set[int] = set()
        for m, attr, is_param in self.plan.grouping.resident:
            t = (m._parameters if is_param else m._buffers)[attr]
            if t is None or id(t) in seen:
                continue
            seen.add(id(t))
            if t.device != dev:
                self.outside_moved.append((m, attr, is_param, t.device))
                _move(m, attr, is_param, dev)

    # -- repair (sources/repair.py): a plain model's only copy is Ferry's -------------------
    def has_truth(self, spec: GroupSpec) -> bool:
        """Whether the group's bytes can be had again from somewhere other than its source:
        DiskTier(source_checkpoint=...) holding its tensors (repair checks the bytes match)."""
        return self._checkpoint is not None and in_index(
            self._checkpoint[1], self._checkpoint[2], spec
        )

    def refill(self, spec: GroupSpec, buf: torch.Tensor) -> None:
        assert self._checkpoint is not None
        refill_from_index(*self._checkpoint, spec, buf)

    def truth_name(self) -> str:
        return self._checkpoint[0].name if self._checkpoint is not None else "nowhere"

    def forget_mapping(self, key: str) -> None:
        self._mmaps.pop(key, None)

    # -- remove / roll back ------------------------------------------------------------------
    def restore_all(self) -> None:
        """Every tensor back on its original device, as a fresh ordinary tensor."""
        errors: list[BaseException] = []
        lost: list[GroupRuntime] = []
        for rt in self.runtimes:
            try:
                self._restore_group(rt)
            except BaseException as e:  # keep restoring the others; report the first
                log.error("ferry: restoring group %s failed: %s", rt.name, e)
                errors.append(e)
                lost.append(rt)
                drop_group(rt, self.backend)
        self.runtimes.clear()
        for m, attr, is_param, dev in reversed(self.outside_moved):
            _move(m, attr, is_param, dev)
        self.outside_moved.clear()
        self._mmaps.clear()
        if self.store is not None:
            self.store.delete()  # a damaged layout's files are worth nothing: never left
        if errors:
            raise lost_error(lost, errors[0])

    def _restore_group(self, rt: GroupRuntime) -> None:
        spec = rt.spec
        src = rt.source.host_bytes(spec.nbytes)
        for e in spec.entries:
            e.point_at(_fresh(e, src))
        rt.host_forms = []
        rt.source.close(self.backend)


def _fresh(e: Entry, src: torch.Tensor) -> torch.Tensor:
    """A new tensor on the entry's original device holding its bytes from ``src``."""
    inner = []
    for part in e.parts:
        t = torch.empty_strided(part.size, part.stride, dtype=part.dtype, device=e.orig_device)
        t.copy_(part.view(src))
        inner.append(t)
    if e.subclass is None:
        return inner[0]
    rebuilt = e.subclass.__tensor_unflatten__(  # type: ignore[attr-defined]
        dict(zip(e.inner_names, inner)), e.ctx, e.outer_size, e.outer_stride
    )
    return nn.Parameter(rebuilt, requires_grad=e.requires_grad) if e.is_param else rebuilt


def _move(m: nn.Module, attr: str, is_param: bool, dev: torch.device) -> None:
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
