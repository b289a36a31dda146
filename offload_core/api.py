"""apply_offload: lay a model out over the tiers, hook it, and hand back a handle."""

from __future__ import annotations

import logging
import mmap
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from . import registry
from .errors import FerryError
from .model.grouping import GroupSpec
from .model.layout import Entry
from .model.plan import OffloadPlan, plan_offload
from .policy import DiskTier, OffloadPolicy, PinnedRamTier
from .runtime.engine import Engine, GroupRuntime
from .runtime.memory import device_memory, release_freed_memory
from .runtime.stats import Counters, OffloadStats, gbps
from .sources.checkpoint import checkpoint_spans as checkpoint_chunks
from .sources.checkpoint import find_prefix, read_checkpoint_index
from .sources.mapped import MappedGroup, can_map
from .sources.reads import CHUNK, Chunk, ReadPlan, open_plan, read_chunk
from .sources.reads import bytes_view as _bytes_view
from .sources.store import GroupStore
from .transfer.backend import Backend, backend_for

log = logging.getLogger("ferry")
Progress = Callable[[int, int], None]


class OffloadHandle:
    """A live offload. ``stats()`` reads it; ``remove()`` undoes it (idempotent)."""

    def __init__(
        self,
        model: nn.Module,
        name: str,
        plan: OffloadPlan,
        layout: _Layout,
        engine: Engine | None,
        counters: Counters,
    ) -> None:
        self.model = model
        self.name = name
        self.plan = plan
        self.policy = plan.policy
        self.device = plan.device
        self._layout = layout
        self._engine = engine
        self._counters = counters
        self._lock = threading.Lock()
        self.removed = False

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
            disk_folder=str(self._layout.store.folder) if self._layout.store else None,
            notes=list(self.plan.notes) + self._layout.notes,
        )

    def remove(self) -> None:
        """Puts every parameter back where and as it was and deletes the files Ferry wrote."""
        with self._lock:
            if self.removed:
                return
            if self._engine is not None:
                self._engine.uninstall()
            self._layout.restore_all()
            release_freed_memory()
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


def apply_offload(
    model: nn.Module,
    policy: OffloadPolicy | None = None,
    *,
    onload_device: str | torch.device | None = None,
    name: str | None = None,
    progress: Progress | None = None,
) -> OffloadHandle:
    """Offloads ``model`` by ``policy``; every check runs before any weight moves.

    Weights move group by group: a group's original storage is released as soon as its copy
    is in place, so the model is never twice in RAM. If anything fails half-way (a full
    disk, an interrupt), the groups already moved are put back and the model is as before.
    """
    plan = plan_offload(model, policy, onload_device=onload_device)
    name = _unique_name(name or type(model).__name__)
    backend = backend_for(plan.device)
    layout = _Layout(model, plan, backend, name)
    layout.build(progress)  # restores everything itself if it fails
    release_freed_memory()
    counters = Counters()
    counters.sample_rss()
    streamed = [rt for rt, gp in zip(layout.runtimes, plan.groups) if not gp.resident]
    engine = None
    if streamed:
        engine = Engine(
            model,
            streamed,
            backend,
            plan.prefetch_depth,
            counters,
            disk=isinstance(plan.policy.tier, DiskTier),
        )
        engine.install()
    handle = OffloadHandle(model, name, plan, layout, engine, counters)
    model.__dict__["_ferry_offload"] = handle
    registry.register(handle)
    return handle


class _Layout:
    """Moves a model's tensors onto the tiers and back."""

    def __init__(self, model: nn.Module, plan: OffloadPlan, backend: Backend, name: str) -> None:
        self.model = model
        self.plan = plan
        self.backend = backend
        self.name = name
        self.runtimes: list[GroupRuntime] = []
        self.outside_moved: list[tuple[nn.Module, str, bool, torch.device]] = []
        self.resident_bufs: dict[int, torch.Tensor] = {}
        self.store: GroupStore | None = None
        self.notes: list[str] = []
        self._mmaps: dict[str, tuple[mmap.mmap, torch.Tensor]] = {}

    # -- apply -------------------------------------------------------------------------------
    def build(self, progress: Progress | None) -> None:
        plan, tier = self.plan, self.plan.policy.tier
        groups = plan.grouping.groups
        try:
            ckpt = None
            if isinstance(tier, DiskTier):
                ckpt = self._checkpoint(tier)
                need = sum(
                    g.nbytes + 65536
                    for g, gp in zip(groups, plan.groups)
                    if not gp.resident
                    and (ckpt is None or checkpoint_chunks(g.entries, *ckpt) is None)
                )
                self.store = GroupStore.open(tier.path, self.name, need)
                self.store.direct_io = tier.direct_io
                if self.store.stale_note:
                    log.warning("ferry: %s", self.store.stale_note)
                    self.notes.append(self.store.stale_note)
            scratch: torch.Tensor | None = None
            for i, (spec, gp) in enumerate(zip(groups, plan.groups)):
                if gp.resident:
                    rt = self._to_device(spec)
                elif isinstance(tier, DiskTier):
                    if scratch is None:
                        scratch = torch.empty(plan.slot_bytes, dtype=torch.uint8)
                    rt = self._to_disk(spec, scratch, ckpt)
                else:
                    rt = self._to_ram(spec, pinned=isinstance(tier, PinnedRamTier))
                self.runtimes.append(rt)
                if progress is not None:
                    progress(i + 1, len(groups))
            self._move_outside()
            if self.store is not None:
                self.store.mark_ready()
        except BaseException:
            self.restore_all()
            raise

    def _checkpoint(self, tier: DiskTier) -> tuple[dict[str, Any], str] | None:
        if not tier.source_checkpoint:
            return None
        index = read_checkpoint_index(Path(tier.source_checkpoint))
        names = [e.qualname for g in self.plan.grouping.groups for e in g.entries]
        prefix = find_prefix(names, index)
        if prefix is None:
            self.notes.append(
                "source_checkpoint holds none of the model's tensors: groups are written"
            )
            return None
        return index, prefix

    def _pack(self, spec: GroupSpec, buf: torch.Tensor) -> None:
        for e in spec.entries:
            e.fill(buf, e.current())

    def _to_device(self, spec: GroupSpec) -> GroupRuntime:
        buf = self.backend.empty_device(spec.nbytes)
        self._pack(spec, buf)
        forms = [e.build(buf) for e in spec.entries]
        self._point(spec, forms)
        self.resident_bufs[spec.index] = buf
        rt = GroupRuntime(spec, [])
        return rt

    def _to_ram(self, spec: GroupSpec, pinned: bool) -> GroupRuntime:
        slab = self.backend.empty_host(spec.nbytes, pinned=pinned and self.backend.can_pin)
        self._pack(spec, slab)
        forms = [e.build(slab) for e in spec.entries]
        self._point(spec, forms)
        rt = GroupRuntime(spec, forms)
        rt.slab = slab
        return rt

    def _to_disk(
        self, spec: GroupSpec, scratch: torch.Tensor, ckpt: tuple[dict[str, Any], str] | None
    ) -> GroupRuntime:
        assert self.store is not None
        buf = scratch[: spec.nbytes]
        buf.zero_()  # padding bytes are part of the checksummed data
        self._pack(spec, buf)
        tier = self.plan.policy.tier
        assert isinstance(tier, DiskTier)
        read_plan = self._from_checkpoint(spec, buf, ckpt) if ckpt else None
        mapped = None
        if read_plan is not None:
            forms = self._checkpoint_forms(spec, read_plan, ckpt)
        else:
            read_plan = self.store.write_group(spec.index, spec.entries, buf)
            mm, whole = self._mapped(read_plan)
            data = whole[read_plan.chunks[0].file_offset :]
            forms = [e.build(data) for e in spec.entries]
            if self.backend.synchronous and tier.cpu_read == "mapped" and can_map():
                mapped = MappedGroup.of(read_plan, mm)
        read_plan.verify_every_read = tier.verify == "every_read"
        self._point(spec, forms)
        rt = GroupRuntime(spec, forms)
        rt.plan = read_plan
        rt.mapped = mapped
        return rt

    def _from_checkpoint(
        self, spec: GroupSpec, packed: torch.Tensor, ckpt: tuple[dict[str, Any], str]
    ) -> ReadPlan | None:
        """A plan that reads the group straight from the user's checkpoint, if the bytes there
        are exactly the model's (compared here, once)."""
        index, prefix = ckpt
        spans = checkpoint_chunks(spec.entries, index, prefix)
        tier = self.plan.policy.tier
        assert isinstance(tier, DiskTier) and tier.source_checkpoint
        if spans is None or any(
            s % e.parts[0].dtype.itemsize for (s, _, _), e in zip(spans, spec.entries)
        ):
            return None
        chunks = []
        for file_off, buf_off, n in spans:
            for o in range(0, n, CHUNK):
                m = min(CHUNK, n - o)
                crc = zlib.crc32(_bytes_view(packed[buf_off + o : buf_off + o + m]))
                chunks.append(Chunk(file_off + o, buf_off + o, m, crc))
        plan = open_plan(Path(tier.source_checkpoint), chunks, owned=False)
        check = torch.empty_like(packed)
        try:
            for c in chunks:
                read_chunk(plan, c, check)  # raises on a mismatch: the weights changed
        except FerryError:
            plan.close()
            return None
        plan.verified = True
        return plan

    def _mapped(self, plan: ReadPlan) -> tuple[mmap.mmap, torch.Tensor]:
        key = str(plan.path)
        if key not in self._mmaps:
            # Copy-on-write: a stray in-place write from user code never reaches the file.
            mm = mmap.mmap(plan.fd, 0, access=mmap.ACCESS_COPY)
            self._mmaps[key] = (mm, torch.frombuffer(mm, dtype=torch.uint8))
        return self._mmaps[key]

    def _checkpoint_forms(
        self, spec: GroupSpec, plan: ReadPlan, ckpt: tuple[dict[str, Any], str] | None
    ) -> list[torch.Tensor]:
        assert ckpt is not None
        index, prefix = ckpt
        _, whole = self._mapped(plan)
        forms = []
        for e in spec.entries:
            t = index[prefix + e.qualname]
            part = e.parts[0]
            forms.append(whole[t.start : t.start + t.nbytes].view(part.dtype).view(part.size))
        return forms

    def _point(self, spec: GroupSpec, forms: list[torch.Tensor]) -> None:
        for e, f in zip(spec.entries, forms):
            e.point_at(f)

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

    # -- remove / roll back ------------------------------------------------------------------
    def restore_all(self) -> None:
        """Every tensor back on its original device, as a fresh ordinary tensor."""
        errors: list[BaseException] = []
        for rt in self.runtimes:
            try:
                self._restore_group(rt)
            except BaseException as e:  # keep restoring the others; report the first
                errors.append(e)
        self.runtimes.clear()
        for m, attr, is_param, dev in reversed(self.outside_moved):
            _move(m, attr, is_param, dev)
        self.outside_moved.clear()
        self.resident_bufs.clear()
        self._mmaps.clear()
        if self.store is not None and not errors:
            self.store.delete()
        if errors:
            raise errors[0]

    def _restore_group(self, rt: GroupRuntime) -> None:
        spec = rt.spec
        if spec.index in self.resident_bufs:
            src = self.resident_bufs.pop(spec.index)
        elif rt.slab is not None:
            src = rt.slab
        elif rt.plan is not None:
            src = torch.empty(spec.nbytes, dtype=torch.uint8)
            for c in rt.plan.chunks:
                read_chunk(rt.plan, c, src)
        else:
            return
        for e in spec.entries:
            e.point_at(_fresh(e, src))
        rt.host_forms = []
        rt.mapped = None  # its mapping goes with the last view of it: the file's space too
        if rt.slab is not None:
            self.backend.release_host(rt.slab)
            rt.slab = None
        if rt.plan is not None:
            rt.plan.close()
            rt.plan = None


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
