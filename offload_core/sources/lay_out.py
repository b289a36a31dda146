"""Laying a model's groups out on their sources.

A group kept on the device under a VRAM budget gets a device buffer; every streamed group gets
the source the first kind in sources/kinds.py makes for it. Weights move group by group and
each group's original storage is released as soon as its copy is in place, so the model is
never twice in RAM; if anything fails half-way, the groups already placed are put back
(give_back.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from ..disk.files import files
from ..disk.mapped import can_map, choose_cpu_read
from ..disk.store import GroupStore
from ..model.grouping import GroupSpec
from ..model.plan import OffloadPlan
from ..policy import DiskTier, PinnedRamTier, SharedRamTier
from ..runtime.group import GroupRuntime
from ..runtime.memory import HeapTrimmer, system_available_ram
from ..transfer.backend import Backend
from ..units import fmt_bytes
from .give_back import restore_all
from .kinds import Placed, make_source
from .origin import Origin
from .placement import Placement, move_tensor, point_all
from .resident import DeviceBytes, ResidentGroup
from .shared_slab import SharedSlabSource, shared_note

log = logging.getLogger("ferry")
Progress = Callable[[int, int], None]
#: A group file's header, beside its data, when sizing the disk tier's folder.
HEADER_ALLOWANCE = 65536


def available_ram() -> int | None:
    """The RAM the system could give now (psutil's "available"), None where unknown."""
    try:
        return system_available_ram()
    except (ImportError, OSError):
        return None


def lay_out(
    model: nn.Module,
    plan: OffloadPlan,
    backend: Backend,
    name: str,
    origin: Origin,
    progress: Progress | None = None,
) -> Placement:
    """``model``'s groups placed by ``plan``; on failure everything is put back first."""
    placement = Placement(model, plan, backend, name, origin)
    LayOut(placement).run(progress)
    return placement


def _source(rt: GroupRuntime | ResidentGroup) -> object:
    return rt.source if isinstance(rt, GroupRuntime) else None


class LayOut:
    """Moves a model's tensors onto their sources, group by group, into ``placement``; counts
    the pinned tier's share while it does."""

    def __init__(self, placement: Placement) -> None:
        self.placement = placement
        #: The pinned tier's share: pinned, and past its pin limit (in RAM, staged).
        self.pinned_bytes = 0
        self.staged_bytes = 0
        self.pin_refused = False  # the system refused a pin: the rest waits in RAM

    def run(self, progress: Progress | None) -> None:
        p = self.placement
        plan = p.plan
        groups = plan.grouping.groups
        try:
            with p.origin.opened(plan, p.notes):
                if isinstance(p.tier, DiskTier):
                    self._open_disk(p.tier)
                scratch: torch.Tensor | None = None
                trimmer = HeapTrimmer()  # a re-layout from the disk tier held the network
                # twice without it (tests/comfyui/test_comfyui_relayout_cgroup.py)
                for i, (spec, gp) in enumerate(zip(groups, plan.groups)):
                    # The disk and shared tiers copy each group out of one reused scratch.
                    copied_out = isinstance(p.tier, (DiskTier, SharedRamTier))
                    if copied_out and not gp.resident and scratch is None:
                        scratch = torch.empty(plan.slot_bytes, dtype=torch.uint8)
                    p.runtimes.append(self._place(spec, gp.resident, scratch))
                    trimmer.freed(spec.nbytes)  # the group's original tensors
                    if progress is not None:
                        progress(i + 1, len(groups))
                self._move_outside()
            if self.staged_bytes:
                p.notes.append(
                    f"pinned tier: {fmt_bytes(self.pinned_bytes)} pinned; the "
                    f"{fmt_bytes(self.staged_bytes)} past the pin limit wait in RAM and reach "
                    "the device through the pinned staging buffers"
                )
            shared = shared_note(
                [s for s in map(_source, p.runtimes) if isinstance(s, SharedSlabSource)],
                p.backend.can_pin,
            )
            if shared:
                log.info("ferry: %s: %s", p.name, shared)
                p.notes.append(shared)
            if p.store is not None:
                p.store.mark_ready()
        except BaseException:
            restore_all(p)
            raise

    def _open_disk(self, tier: DiskTier) -> None:
        """Claims the folder, sized for what will be written, before anything moves."""
        p = self.placement
        need = sum(
            g.nbytes + HEADER_ALLOWANCE
            for g, gp in zip(p.plan.grouping.groups, p.plan.groups)
            if not gp.resident and not p.origin.verbatim(g.entries)
        )
        if p.backend.synchronous:
            self._choose_cpu_read(tier)
        # Each streamed group keeps its file open: to read, with O_DIRECT beside it
        # (disk/reader.py), and the descriptor Python's mmap keeps for its forms.
        backend = files()
        backend.reserve_descriptors(3 * sum(not gp.resident for gp in p.plan.groups))
        # Chosen once for the platform (disk/files.py); said, so a slow disk tier on another
        # OS can be told from a slow disk.
        pages = "huge pages" if backend.huge_pages else "ordinary pages"
        p.notes.append(f"disk reads: {backend.name}; read buffers on {pages}")
        p.store = GroupStore.open(tier.path, p.name, need)
        p.store.direct_io = tier.direct_io
        if p.store.stale_note:
            log.warning("ferry: %s", p.store.stale_note)
            p.notes.append(p.store.stale_note)

    def _choose_cpu_read(self, tier: DiskTier) -> None:
        p = self.placement
        slots = p.plan.n_slots * p.plan.slot_bytes
        p.cpu_read = choose_cpu_read(tier.cpu_read, slots, available_ram())
        if p.cpu_read == "mapped" and not can_map():
            p.cpu_read = "copy"
            p.notes.append(
                "cpu_read mapped: this platform cannot drop a mapping's pages at once (Linux "
                "only), so groups are copied into slots (cpu_read copy)"
            )
        if tier.cpu_read == "auto":
            p.notes.append(
                f"cpu_read auto: {p.cpu_read} ({p.plan.n_slots} slots of "
                f"{fmt_bytes(p.plan.slot_bytes)}; see choose_cpu_read)"
            )

    def _slab_for(
        self, spec: GroupSpec, resident: bool, scratch: torch.Tensor | None
    ) -> tuple[torch.Tensor, bool]:
        """Where the group's bytes are packed: a device buffer (resident), the disk tier's
        scratch (written to a file next), or the group's own host slab; and whether that
        slab is pinned."""
        p = self.placement
        if resident:
            return p.backend.empty_device(spec.nbytes), False
        if scratch is not None:
            buf = scratch[: spec.nbytes]
            buf.zero_()  # padding bytes are part of the checksummed data
            return buf, False
        if isinstance(p.tier, PinnedRamTier) and p.backend.can_pin:
            pinned = self._pinned_slab(p.tier, spec.nbytes)
            if pinned is not None:
                return pinned, True
        return p.backend.empty_host(spec.nbytes, pinned=False), False

    def _pinned_slab(self, tier: PinnedRamTier, nbytes: int) -> torch.Tensor | None:
        """A pinned slab while the pinned share stays under the tier's ``pin_limit`` and
        the system pins it; None past either (the group waits in RAM and reaches the device
        through the staging ring: [Note: the RAM tier through staging])."""
        limit = tier.pin_limit
        if self.pin_refused or (limit is not None and self.pinned_bytes + nbytes > limit):
            self.staged_bytes += nbytes
            return None
        try:
            buf = self.placement.backend.empty_host(nbytes, pinned=True)
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
        verbatim = self.placement.origin.fill(spec, buf)
        if resident:
            point_all(spec.entries, [e.build(buf) for e in spec.entries])
            return ResidentGroup(spec, DeviceBytes(buf))
        source, forms = make_source(self.placement, Placed(spec, buf, verbatim, pinned))
        point_all(spec.entries, forms)
        return GroupRuntime(spec, source, forms)

    def _move_outside(self) -> None:
        p = self.placement
        p.origin.place_outside(p.model, p.plan)
        dev = p.plan.device
        seen: set[int] = set()
        for m, attr, is_param in p.plan.grouping.resident:
            t = (m._parameters if is_param else m._buffers)[attr]
            if t is None or id(t) in seen:
                continue
            seen.add(id(t))
            if t.device != dev:
                p.outside_moved.append((m, attr, is_param, t.device))
                move_tensor(m, attr, is_param, dev)
