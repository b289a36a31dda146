"""apply_offload: lay a model out over the tiers, hook it, and hand back a handle."""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
from collections.abc import Iterator

import torch
from torch import nn

from . import registry
from .ending import Ending, parse_ending
from .model.plan import OffloadPlan, plan_offload
from .offload_kind import OffloadKind, parse_kind
from .policy import DiskTier, OffloadPolicy, parse_whole_number
from .quant.report import QuantReport
from .runtime.engine import Engine
from .runtime.group import GroupRuntime
from .runtime.group_states import strip
from .runtime.memory import device_memory, release_freed_memory
from .runtime.stats import Counters, OffloadStats
from .sources.checkpoint_origin import CheckpointOrigin
from .sources.checkpoint_stream import CheckpointWeights
from .sources.give_back import drop_all, restore_all
from .sources.lay_out import Progress, lay_out
from .sources.origin import ModelOrigin
from .sources.placement import Placement
from .sources.repair_group import repair_group
from .transfer.backend import backend_for
from .units import gbps

#: Every layout's number, from 1 (OffloadStats.layout_id).
_layout_ids = itertools.count(1)


class OffloadHandle:
    """A live offload. ``stats()`` reads it; ``remove()`` undoes it (idempotent)."""

    def __init__(
        self,
        model: nn.Module,
        name: str,
        plan: OffloadPlan,
        placement: Placement,
        engine: Engine | None,
        counters: Counters,
        kind: OffloadKind = OffloadKind.MODEL,
    ) -> None:
        self.model = model
        self.name = name
        #: What the network is (the UIs' line title says it).
        self.kind = kind
        self.plan = plan
        self.policy = plan.policy
        self.device = plan.device
        self._placement = placement
        self._engine = engine
        self._counters = counters
        self._lock = threading.Lock()
        self.removed = False
        #: What ``load_offloaded(quantize=...)`` quantized, per layer (None: nothing).
        self.quant_report: QuantReport | None = None
        #: Why its settings (the host's planner's sentence; None: the user's), for its lines.
        self.why: str | None = None
        self.layout_id = next(_layout_ids)

    def stats(self) -> OffloadStats:
        c = self._counters
        with c.lock:
            snap = {k: getattr(c, k) for k in ("forwards", "group_loads", "on_demand_loads",
                    "bytes_h2d", "bytes_disk", "h2d_s", "disk_s", "stall_s")}  # fmt: skip
        transfer = snap["h2d_s"] + snap["disk_s"]
        overlap = None
        if transfer > 0:
            overlap = max(0.0, min(1.0, 1.0 - snap["stall_s"] / transfer))
        dm = device_memory(self.device)
        return OffloadStats(
            name=self.name,
            kind=self.kind.value,
            device=str(self.device),
            level=self.policy.level_name,
            tier=self.policy.tier_name,
            groups=len(self.plan.groups),
            resident_groups=len(self.plan.groups) - len(self.plan.streamed),
            prefetch_depth=self.plan.prefetch_depth,
            forwards=snap["forwards"],
            group_loads=snap["group_loads"],
            on_demand_loads=snap["on_demand_loads"],
            bytes_per_tier=self.plan.bytes_per_tier() if not self.removed else {},
            bytes_h2d=snap["bytes_h2d"],
            bytes_disk=snap["bytes_disk"],
            h2d_gbps=gbps(snap["bytes_h2d"], snap["h2d_s"]),
            disk_gbps=gbps(snap["bytes_disk"], snap["disk_s"]),
            transfer_s=transfer,
            stall_s=snap["stall_s"],
            overlap=overlap,
            peak_vram=dm.peak_allocated if dm else None,
            peak_rss=dict(c.peak_rss),
            never_ran=list(self._engine.never_ran) if self._engine else [],
            disk_folder=str(self._placement.store.folder) if self._placement.store else None,
            notes=list(self.plan.notes) + self._placement.notes,
            why=self.why,
            layout_id=self.layout_id,
            group_states=self._group_states(),
        )

    def _group_states(self) -> str:
        """The strip the UIs draw (runtime/group_states.py); "" once removed."""
        if self.removed:
            return ""
        engine = self._engine  # read once: remove() on another thread sets it to None
        streamed = engine.group_states() if engine is not None else []
        return strip([g.resident for g in self.plan.groups], streamed)

    @contextlib.contextmanager
    def one_pass(self) -> Iterator[None]:
        """Marks one pass of the model, for a host that calls its parts and never its root
        (a text encoder's encoders): [Note: a pass the host marks] in runtime/engine.py."""
        if self._engine is None:
            yield
            return
        with self._engine.one_pass():
            yield

    def remove(self, ending: Ending | str = Ending.RESTORE) -> None:
        """Ends the offload and deletes the files Ferry wrote. ``ending`` says why
        ([Note: release by kind of ending] in ending.py): ``RESTORE`` (the default) puts every
        parameter back where and as it was, group by group; ``DISCARD``, for a network that is
        being thrown away, drops Ferry's copies without reading anything back (its group
        tensors are left on the meta device)."""
        ending = parse_ending(ending)
        with self._lock:
            if self.removed:
                return
            # Never half-way: whatever fails, the model no longer has this offload (a node
            # can then lay it out again, or load the model again) -- unless some groups could
            # not be read back for a reason other than damage (restore_all keeps them, their
            # files too): then the offload stays, and remove() again finishes it.
            try:
                if self._engine is not None:
                    engine, self._engine = self._engine, None
                    try:
                        engine.uninstall()
                    finally:
                        del engine  # it lists the groups: they go one by one below
            finally:
                try:
                    if ending is Ending.DISCARD:
                        drop_all(self._placement)
                    else:
                        restore_all(self._placement)
                finally:
                    release_freed_memory()
                    if not self._placement.runtimes:
                        self.removed = True
                        self.model.__dict__.pop("_ferry_offload", None)
                        registry.unregister(self)

    def __repr__(self) -> str:
        state = "removed" if self.removed else "live"
        return f"<OffloadHandle {self.name!r} {self.policy.level_name}/{self.policy.tier_name} {state}>"


def find_offload(model: nn.Module) -> OffloadHandle | None:
    return model.__dict__.get("_ferry_offload")


def _unique_name(base: str) -> str:
    name, n = base, 1
    while registry.name_taken(name):
        n += 1
        name = f"{base}-{n}"
    return name


def _staged(plan: OffloadPlan, streamed: list[GroupRuntime]) -> bool:
    """Whether the engine needs the staging ring: disk reads and slabs in pageable RAM reach
    a device through it ([Note: the RAM tier through staging])."""
    return isinstance(plan.policy.tier, DiskTier) or any(
        not getattr(g.source, "pinned", True) for g in streamed
    )


def apply_offload(
    model: nn.Module,
    policy: OffloadPolicy | None = None,
    *,
    onload_device: str | torch.device | None = None,
    name: str | None = None,
    kind: OffloadKind | str = OffloadKind.MODEL,
    progress: Progress | None = None,
    weights: CheckpointWeights | None = None,
    read_threads: int = 4,
) -> OffloadHandle:
    """Offloads ``model`` by ``policy``; every check runs before any weight moves.

    Weights move group by group: a group's original storage is released as soon as its copy
    is in place, so the model is never twice in RAM. If anything fails half-way (a full
    disk, an interrupt), the groups already moved are put back and the model is as before.

    weights: for a model built on the meta device, where its tensors wait in its checkpoint
        (``load_offloaded`` opens it): every group is filled straight from the file, so the
        model is never in RAM; ``remove()`` puts its tensors back on meta.
    kind: what ``model`` is in its pipeline (offload_kind.py), for the lines users read.
    read_threads: the disk reader's pool (disk/reader.py): a read of several chunks (a
        group's first, checked read; every read with ``DiskTier(verify="every_read")``)
        fans out on it, and a window read's copies run on it.
    """
    read_threads = parse_whole_number("read_threads", read_threads, 1)
    kind = parse_kind(kind)
    plan = plan_offload(model, policy, onload_device=onload_device)
    name = _unique_name(name or type(model).__name__)
    backend = backend_for(plan.device)
    origin = ModelOrigin() if weights is None else CheckpointOrigin(weights)
    placement = lay_out(model, plan, backend, name, origin, progress)  # puts back if it fails
    release_freed_memory()
    counters = Counters()
    counters.sample_rss()
    streamed = placement.streamed
    engine = None
    if streamed:
        engine = Engine(
            model, streamed, backend, plan.prefetch_depth, counters, _staged(plan, streamed),
            repair=functools.partial(repair_group, placement), read_threads=read_threads,
        )  # fmt: skip
        engine.install()
    handle = OffloadHandle(model, name, plan, placement, engine, counters, kind)
    model.__dict__["_ferry_offload"] = handle
    registry.register(handle)
    return handle
