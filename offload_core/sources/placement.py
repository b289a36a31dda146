"""Placing a model's groups on their sources, and putting everything back.

One ``Placement`` for every model; where the bytes come from is its ``origin`` (origin.py:
the model's own tensors, or a meta-built model's checkpoint). A group kept on the device
under a VRAM budget gets a device buffer; every streamed group gets the source the first kind
in sources/kinds.py makes for it. Weights move group by group and each group's original
storage is released as soon as its copy is in place, so the model is never twice in RAM; if
anything fails half-way, the groups already placed are put back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

import torch
from torch import nn

from ..disk.file_source import FileSource
from ..disk.files import files
from ..disk.mapped import MappedSource, can_map, choose_cpu_read
from ..disk.mappings import Mappings
from ..disk.plan import ReadPlan
from ..disk.repair import slab_from_truth
from ..disk.store import GroupStore
from ..errors import CorruptGroupFileError, RestoreIncompleteError
from ..model.grouping import GroupSpec
from ..model.layout import Entry
from ..model.plan import OffloadPlan
from ..policy import DiskTier, PinnedRamTier, Tier
from ..runtime.group import GroupRuntime
from ..runtime.memory import HeapTrimmer, system_available_ram
from ..transfer.backend import Backend
from ..units import fmt_bytes
from .give_back import drop_group, fresh, lost_error, meta_form
from .kinds import Made, Placed, make_source
from .origin import Origin
from .resident import DeviceBytes, ResidentGroup

log = logging.getLogger("ferry")
Progress = Callable[[int, int], None]
#: A group file's header, beside its data, when sizing the disk tier's folder.
HEADER_ALLOWANCE = 65536
META = torch.device("meta")


def available_ram() -> int | None:
    """The RAM the system could give now (psutil's "available"), None where unknown."""
    try:
        return system_available_ram()
    except (ImportError, OSError):
        return None


class Placement:
    """Moves a model's tensors onto their sources and back."""

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
        #: The pinned tier's share: pinned, and past its pin limit (in RAM, staged).
        self.pinned_bytes = 0
        self.staged_bytes = 0
        self.pin_refused = False  # the system refused a pin: the rest waits in RAM

    @property
    def streamed(self) -> list[GroupRuntime]:
        return [rt for rt in self.runtimes if isinstance(rt, GroupRuntime)]

    # -- apply -------------------------------------------------------------------------------
    def build(self, progress: Progress | None) -> None:
        plan = self.plan
        groups = plan.grouping.groups
        try:
            with self.origin.opened(plan, self.notes):
                if isinstance(self.tier, DiskTier):
                    self._open_disk(self.tier)
                scratch: torch.Tensor | None = None
                trimmer = HeapTrimmer()  # a re-layout from the disk tier held the network
                # twice without it (tests/comfyui/test_comfyui_relayout_cgroup.py)
                for i, (spec, gp) in enumerate(zip(groups, plan.groups)):
                    if isinstance(self.tier, DiskTier) and not gp.resident and scratch is None:
                        scratch = torch.empty(plan.slot_bytes, dtype=torch.uint8)
                    self.runtimes.append(self._place(spec, gp.resident, scratch))
                    trimmer.freed(spec.nbytes)  # the group's original tensors
                    if progress is not None:
                        progress(i + 1, len(groups))
                self._move_outside()
            if self.staged_bytes:
                self.notes.append(
                    f"pinned tier: {fmt_bytes(self.pinned_bytes)} pinned; the "
                    f"{fmt_bytes(self.staged_bytes)} past the pin limit wait in RAM and reach "
                    "the device through the pinned staging buffers"
                )
            if self.store is not None:
                self.store.mark_ready()
        except BaseException:
            self.restore_all()
            raise

    def _open_disk(self, tier: DiskTier) -> None:
        """Claims the folder, sized for what will be written, before anything moves."""
        need = sum(
            g.nbytes + HEADER_ALLOWANCE
            for g, gp in zip(self.plan.grouping.groups, self.plan.groups)
            if not gp.resident and not self.origin.verbatim(g.entries)
        )
        if self.backend.synchronous:
            self._choose_cpu_read(tier)
        # Each streamed group keeps its file open: to read, with O_DIRECT beside it
        # (disk/reader.py), and the descriptor Python's mmap keeps for its forms.
        backend = files()
        backend.reserve_descriptors(3 * sum(not gp.resident for gp in self.plan.groups))
        # Chosen once for the platform (disk/files.py); said, so a slow disk tier on another
        # OS can be told from a slow disk.
        pages = "huge pages" if backend.huge_pages else "ordinary pages"
        self.notes.append(f"disk reads: {backend.name}; read buffers on {pages}")
        self.store = GroupStore.open(tier.path, self.name, need)
        self.store.direct_io = tier.direct_io
        if self.store.stale_note:
            log.warning("ferry: %s", self.store.stale_note)
            self.notes.append(self.store.stale_note)

    def _choose_cpu_read(self, tier: DiskTier) -> None:
        slots = self.plan.n_slots * self.plan.slot_bytes
        self.cpu_read = choose_cpu_read(tier.cpu_read, slots, available_ram())
        if self.cpu_read == "mapped" and not can_map():
            self.cpu_read = "copy"
            self.notes.append(
                "cpu_read mapped: this platform cannot drop a mapping's pages at once (Linux "
                "only), so groups are copied into slots (cpu_read copy)"
            )
        if tier.cpu_read == "auto":
            self.notes.append(
                f"cpu_read auto: {self.cpu_read} ({self.plan.n_slots} slots of "
                f"{fmt_bytes(self.plan.slot_bytes)}; see choose_cpu_read)"
            )

    def _slab_for(
        self, spec: GroupSpec, resident: bool, scratch: torch.Tensor | None
    ) -> tuple[torch.Tensor, bool]:
        """Where the group's bytes are packed: a device buffer (resident), the disk tier's
        scratch (written to a file next), or the group's own host slab; and whether that
        slab is pinned."""
        if resident:
            return self.backend.empty_device(spec.nbytes), False
        if scratch is not None:
            buf = scratch[: spec.nbytes]
            buf.zero_()  # padding bytes are part of the checksummed data
            return buf, False
        if isinstance(self.tier, PinnedRamTier) and self.backend.can_pin:
            pinned = self._pinned_slab(self.tier, spec.nbytes)
            if pinned is not None:
                return pinned, True
        return self.backend.empty_host(spec.nbytes, pinned=False), False

    def _pinned_slab(self, tier: PinnedRamTier, nbytes: int) -> torch.Tensor | None:
        """A pinned slab while the pinned share stays under the tier's ``pin_limit`` and
        the system pins it; None past either (the group waits in RAM and reaches the device
        through the staging ring: [Note: the RAM tier through staging])."""
        limit = tier.pin_limit
        if self.pin_refused or (limit is not None and self.pinned_bytes + nbytes > limit):
            self.staged_bytes += nbytes
            return None
        try:
            buf = self.backend.empty_host(nbytes, pinned=True)
        except RuntimeError as e:  # the system's own cap (Windows: about half of RAM)
            log.info("ferry: pinning stopped at %s: %s", fmt_bytes(self.pinned_bytes), e)
            self.pin_refused = True
            self.staged_bytes += nbytes
            return None
        self.pinned_bytes += nbytes
        return buf

    def _place(
        self, spec: GroupSpec, resident: bool, scratch: torch.Tensor | None
    ) -> GroupRuntime | ResidentGroup:
        buf, pinned = self._slab_for(spec, resident, scratch)
        verbatim = self.origin.fill(spec, buf)
        if resident:
            _point_all(spec.entries, [e.build(buf) for e in spec.entries])
            return ResidentGroup(spec, DeviceBytes(buf))
        source, forms = make_source(self, Placed(spec, buf, verbatim, pinned))
        _point_all(spec.entries, forms)
        return GroupRuntime(spec, source, forms)

    def _move_outside(self) -> None:
        self.origin.place_outside(self.model, self.plan)
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

    # -- what the source kinds ask (sources/kinds.py: Placing) -------------------------------
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

    # -- repair (disk/repair.py) -------------------------------------------------------------
    def repair(self, rt: GroupRuntime) -> bool:
        """Rewrites the group's damaged file from its source of truth; False when it has
        none. See [Note: repairing a group under the engine] in disk/repair.py."""
        slab = slab_from_truth(self.store, rt.source.file_plan, rt.spec, self.origin)
        if slab is None:
            return False
        plan = self.rewrite(rt, slab)
        log.warning(
            "ferry: %s was damaged; rewrote it from %s", plan.path.name, self.origin.truth_name()
        )
        return True

    def rewrite(self, rt: GroupRuntime, slab: torch.Tensor) -> ReadPlan:
        """The group's file written anew from ``slab`` (its folder made again if deleted);
        the group gets a fresh source on the same read path and fresh host forms.
        [Note: repairing a group under the engine] in disk/repair.py says when this is safe."""
        assert self.store is not None
        old = rt.source

        def let_go() -> None:
            # Nothing of the old file may stay open or mapped when the new one takes its name
            # (Windows refuses the rename otherwise): the entries wait on meta until the new
            # forms, the mapping goes with its last view.
            _point_all(rt.spec.entries, [_placeholder(e) for e in rt.spec.entries])
            rt.host_forms = []
            if old.file_plan is not None:
                self.mappings.forget(old.file_plan.path)
            old.close(self.backend)

        self.store.reopen()
        plan = self.write_group(rt.spec, slab, let_go)
        rt.source, rt.host_forms = self.group_file_source(rt.spec, plan)
        _point_all(rt.spec.entries, rt.host_forms)
        return plan

    # -- remove / roll back ------------------------------------------------------------------
    # [Note: release by kind of ending] in ending.py: restore_all gives the weights back group
    # by group, drop_all drops Ferry's copies without reading them.
    def restore_all(self) -> None:
        """Every tensor back on its original device, as a fresh ordinary tensor (a tensor
        whose home is its checkpoint back on the meta device, read from nowhere).

        Group by group: a group's copy (its slab, its file's descriptors) is let go as soon as
        its tensors hold their own bytes again, so the model is never twice in memory.

        Only damage loses a group: a group whose only copy is a file whose bytes are wrong
        (``CorruptGroupFileError``) goes to the meta device. Any other error (the platform
        refusing a call, Ferry's own bug, an interrupt, no memory) keeps the group as it was,
        its file and descriptors too, and is raised once the others are restored: calling
        this again restores what is left. See ``RestoreIncompleteError``."""
        self.origin.restore_outside()
        damage: CorruptGroupFileError | None = None
        lost: list[GroupRuntime | ResidentGroup] = []
        kept: list[GroupRuntime | ResidentGroup] = []
        failed: BaseException | None = None
        # Taken off the list one at a time: a restored group is then held by nothing, and its
        # copy is freed before the next group's fresh tensors are made.
        todo, self.runtimes = self.runtimes, kept
        todo.reverse()
        trimmer = HeapTrimmer()
        while todo:
            rt = todo.pop()
            trimmer.freed(rt.spec.nbytes)  # the copies and read buffers freed so far
            try:
                self._restore_group(rt)
            except CorruptGroupFileError as e:  # the file's bytes say so: nothing to read back
                log.error("ferry: restoring group %s failed: %s", rt.name, e)
                damage = damage or e
                lost.append(rt)
                drop_group(rt, self.backend)
            except BaseException as e:  # not the file's fault: keep the group as it is
                log.error("ferry: restoring group %s failed (kept, not dropped): %r", rt.name, e)
                failed = failed or e
                kept.append(rt)
            del rt
        if not kept:
            for m, attr, is_param, dev in reversed(self.outside_moved):
                _move(m, attr, is_param, dev)
            self._forget_files()
        if failed is not None:
            if not isinstance(failed, Exception):
                raise failed  # an interrupt stays an interrupt; remove() again finishes
            raise RestoreIncompleteError([rt.name for rt in kept], failed) from failed
        if damage is not None:
            raise lost_error(lost, damage)

    def drop_all(self) -> None:
        """The network is being discarded: every group's copy is dropped without a read (its
        tensors go to the meta device), its files deleted; the tensors outside the groups stay
        where they are and go with the network. Never raises for a damaged file: nothing is
        read."""
        todo, self.runtimes = self.runtimes, []
        while todo:
            drop_group(todo.pop(), self.backend)
        self._forget_files()

    def _forget_files(self) -> None:
        """Once no group is left: the outside tensors' old places, the mappings and Ferry's
        folder go (a damaged or discarded layout's files are worth nothing: never left)."""
        self.outside_moved.clear()
        self.mappings.clear()
        if self.store is not None:
            self.store.delete()

    def _restore_group(self, rt: GroupRuntime | ResidentGroup) -> None:
        spec = rt.spec
        if all(e.orig_device == META for e in spec.entries):
            for e in spec.entries:  # back in the file: on meta, a tensor subclass as such
                e.put(meta_form(e))
        else:
            src = rt.source.host_bytes(spec.nbytes)
            for e in spec.entries:
                e.point_at(fresh(e, src))
        rt.host_forms = []
        rt.source.close(self.backend)


def _point_all(entries: list[Entry], forms: list[torch.Tensor]) -> None:
    """Each entry's module at its form: a tensor that waits in its file (meta) is replaced,
    any other keeps its object (``Entry.point_at``)."""
    for e, f in zip(entries, forms):
        if e.orig_device == META:
            e.put(f)
        else:
            e.point_at(f)


def _placeholder(e: Entry) -> torch.Tensor:
    """What an entry holds while its file is replaced: meta for a tensor whose home is a
    file, else untouched memory of its layout (never read: the new forms replace it in the
    same call, and pages never touched are never taken)."""
    return meta_form(e, META if e.orig_device == META else torch.device("cpu"))


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
