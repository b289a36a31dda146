"""The runtime: hooks that bring each group into a device slot just before it runs.

[Note: the schedule]
Groups run in an order traced from the forwards themselves (the first guess is registration
order; a forward that runs groups in another order re-traces it). Activation number ``t``
(counted across forwards) uses slot ``t % S`` with ``S = prefetch_depth + 1``. When group
``t`` starts, the loads for ``t+1 .. t+depth`` are already in flight, wrapping past the end of
the order into the next forward, so the first groups of a forward arrive while the previous
forward's last groups compute.

[Note: the three waits] (see backend.py) are issued here and nowhere else:
  1. ``_activate``: compute waits on the load's ready-event;
  2. ``_copy_into_slot``: the copy stream waits on the slot's compute-done event;
  3. ``_disk_task``: the host waits on the staging buffer's last copy before refilling it.
A load's ready-event travels with the load (``Load.ready`` or the future that resolves to it).
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import FerryError
from ..model.grouping import GroupSpec
from ..sources.mapped import MappedGroup
from ..sources.reads import ReadPlan, check_identity, read_chunk
from ..transfer.backend import Backend
from .stats import Counters

log = logging.getLogger("ferry")


class GroupRuntime:
    """One group at run time: where its bytes wait and which forms its tensors take."""

    def __init__(self, spec: GroupSpec, host_forms: list[torch.Tensor]) -> None:
        self.spec = spec
        self.host_forms = host_forms  # what each entry points at while offloaded
        self.slab: torch.Tensor | None = None  # host tiers: the packed bytes
        self.plan: ReadPlan | None = None  # disk tier: how to read them
        #: disk tier on a CPU: computed in place from the file's mapping, no slot (mapped.py)
        self.mapped: MappedGroup | None = None
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


@dataclass
class Slot:
    index: int
    buf: torch.Tensor  # on the onload device, sized for the largest streamed group
    free: Any = None  # compute-done event of the group that last read it


@dataclass
class Staging:
    buf: torch.Tensor  # pinned host memory the reader threads fill
    free: Any = None  # event of the last copy out of it


@dataclass
class Load:
    """A group on its way into a slot; its ready-event travels with it."""

    step: int
    pos: int | None  # position in the traced order, None when not in the order
    group: GroupRuntime
    slot: Slot | None  # None for a mapped group: it is computed where it lies
    ready: Any = None
    future: Future[Any] | None = None
    staging: Staging | None = None


class Engine:
    def __init__(
        self,
        root: nn.Module,
        groups: list[GroupRuntime],
        backend: Backend,
        prefetch_depth: int,
        counters: Counters,
        disk: bool,
        read_threads: int = 4,
    ) -> None:
        self.root = root
        self.groups = groups
        self.backend = backend
        self.depth = prefetch_depth
        self.counters = counters
        self.disk = disk
        self.read_threads = read_threads
        self.order: list[GroupRuntime] = list(groups)
        n_slots = prefetch_depth + 1
        slotted = [g for g in groups if g.mapped is None]
        slot_bytes = max((g.spec.nbytes for g in slotted), default=0)
        self.slots: list[Slot] = []
        if slotted:
            self.slots = [Slot(i, backend.empty_device(slot_bytes)) for i in range(n_slots)]
        self.stagings: list[Staging] = []
        if disk and slotted and not backend.synchronous:
            self.stagings = [
                Staging(backend.empty_host(slot_bytes, pinned=backend.can_pin))
                for _ in range(n_slots)
            ]
        self.window: deque[Load] = deque()
        self.current: GroupRuntime | None = None
        self.step = 0  # activations so far
        self.next_step = 1  # activation number of the next load issued
        self.pos: int | None = None
        self.in_forward = False
        self.observed: list[GroupRuntime] = []
        self.never_ran: list[str] = []
        self._group_pool: ThreadPoolExecutor | None = None
        self._chunk_pool: ThreadPoolExecutor | None = None
        self._timings: list[tuple[str, Any, Any]] = []
        self._hooks: list[Any] = []
        self.retraced = 0

    # -- hooks ----------------------------------------------------------------------------
    def install(self) -> None:
        # Under torch.compile the hooks run eagerly (a graph break per group): they swap
        # tensors and wait on events, which a graph must not capture.
        eager = torch.compiler.disable
        for g in self.groups:
            for _, m in g.spec.modules:
                self._hooks.append(m.register_forward_pre_hook(eager(self._make_pre_hook(g))))
        self._hooks.append(self.root.register_forward_pre_hook(eager(self._root_pre)))
        self._hooks.append(
            self.root.register_forward_hook(eager(self._root_post), always_call=True)
        )

    def _make_pre_hook(self, g: GroupRuntime) -> Callable[..., None]:
        def pre_hook(module: nn.Module, args: Any) -> None:
            self.enter(g)

        return pre_hook

    def _root_pre(self, module: nn.Module, args: Any) -> None:
        if self.in_forward:
            # The previous forward never reached its end (KeyboardInterrupt skips hooks).
            self._abort()
        self._release_current()
        self.in_forward = True
        self.observed = []
        if not self.window:
            # Nothing prefetched (first forward, or after an error): start the first groups
            # now, while the layers before the first block compute.
            self.pos = -1
            self._top_up()

    def _root_post(self, module: nn.Module, args: Any, output: Any) -> None:
        failed = sys.exc_info()[0] is not None
        if failed:
            self._abort()
            return
        self._release_current()
        self.in_forward = False
        self.counters.add(forwards=1)
        self.counters.sample_rss()
        if [g.spec.index for g in self.observed] != [g.spec.index for g in self.order]:
            self._retrace()
        self._resolve_timings()

    # -- the schedule ---------------------------------------------------------------------
    def enter(self, g: GroupRuntime) -> None:
        if g is self.current:
            return
        if torch.is_grad_enabled() and g.requires_grad:
            raise FerryError(
                f"group {g.name} has parameters that require grad and autograd is on: Ferry's "
                "offload is for inference. Run the model under torch.no_grad() or "
                "torch.inference_mode(), or call model.requires_grad_(False)"
            )
        self._release_current()
        if self.in_forward:
            self.observed.append(g)
        load = self._take(g)
        self._activate(load)
        self._top_up()

    def _take(self, g: GroupRuntime) -> Load:
        if self.window and self.window[0].group is g:
            return self.window.popleft()
        # Not what was predicted: drop the window and fetch on demand.
        self._drain()
        self.counters.add(on_demand_loads=1)
        pos = self._position_of(g)
        load = self._issue(g, pos)
        return load

    def _position_of(self, g: GroupRuntime) -> int | None:
        n = len(self.order)
        start = (self.pos + 1) if self.pos is not None else 0
        for k in range(n):
            p = (start + k) % n
            if self.order[p] is g:
                return p
        return None

    def _activate(self, load: Load) -> None:
        t0 = time.perf_counter()
        ready = load.ready
        if load.future is not None:
            ready = load.future.result()
            if load.staging is not None:
                load.staging.free = ready
        waited = time.perf_counter() - t0
        compute = self.backend.compute_stream()
        if ready is not None:
            pair = self.backend.timing_pair()
            if pair is not None:
                compute.record_event(pair[0])
            self.backend.wait(compute, ready)  # wait 1: the slot's bytes are in
            if pair is not None:
                compute.record_event(pair[1])
                self._timings.append(("stall", pair[0], pair[1]))
        if load.slot is not None:
            load.group.to_slot(load.slot)
        self.current = load.group
        self.step = load.step
        self.pos = load.pos
        self.counters.add(stall_s=waited, group_loads=1)

    def _release_current(self) -> None:
        g = self.current
        if g is None:
            return
        if g.mapped is not None:
            self.current = None
            g.mapped.release()  # the CPU is done with it: its forward has returned
            return
        assert g.slot is not None
        g.slot.free = self.backend.record(self.backend.compute_stream())
        g.to_host()
        self.current = None

    def _top_up(self) -> None:
        if self.pos is None or not self.order:
            return
        n = len(self.order)
        last = self.window[-1].pos if self.window else self.pos
        while len(self.window) < self.depth and last is not None:
            last = (last + 1) % n
            self.window.append(self._issue(self.order[last], last))

    def _issue(self, g: GroupRuntime, pos: int | None) -> Load:
        step = self.next_step
        self.next_step += 1
        if g.mapped is not None:
            load = Load(step, pos, g, None)
            load.future = self._groups().submit(self._load_mapped, g.mapped)
            return load
        slot = self.slots[step % len(self.slots)]
        load = Load(step, pos, g, slot)
        if g.plan is None:
            load.ready = self._copy_into_slot(slot, g.slab, g.spec.nbytes, slot.free)
        elif self.backend.synchronous:
            # The CPU computes on the host's timeline: the slot's last reader is done, so
            # the reader threads can fill the slot itself, no staging buffer, no copy.
            plan = g.plan
            load.future = self._groups().submit(
                self.backend.host_fill, slot.buf, lambda: self._read(plan, slot.buf)
            )
        else:
            staging = self.stagings[step % len(self.stagings)]
            load.staging = staging
            plan, staging_free, slot_free = g.plan, staging.free, slot.free
            load.future = self._groups().submit(
                self._disk_task, plan, staging, staging_free, slot, slot_free
            )
        return load

    def _copy_into_slot(
        self, slot: Slot, src: torch.Tensor | None, nbytes: int, slot_free: Any
    ) -> Any:
        assert src is not None
        b = self.backend
        stream = b.copy_stream()
        with b.use_stream(stream):
            if slot_free is not None:
                b.wait(stream, slot_free)  # wait 2: the slot's last reader is done
            pair = b.timing_pair()
            t0 = time.perf_counter()
            if pair is not None:
                stream.record_event(pair[0])
            b.copy(slot.buf[:nbytes], src[:nbytes])
            ready = b.record(stream)
            if pair is not None:
                stream.record_event(pair[1])
                with self.counters.lock:
                    self._timings.append(("h2d", pair[0], pair[1]))
                self.counters.add(bytes_h2d=nbytes)
            else:
                self.counters.add(bytes_h2d=nbytes, h2d_s=time.perf_counter() - t0)
                if self.backend.synchronous:
                    # A CPU copy blocks compute: it is stall, not overlap.
                    self.counters.add(stall_s=time.perf_counter() - t0)
        return ready

    def _disk_task(
        self, plan: ReadPlan, staging: Staging, staging_free: Any, slot: Slot, slot_free: Any
    ) -> Any:
        if staging_free is not None:
            self.backend.host_wait(staging_free)  # wait 3: the last copy out of it is done
        self.backend.host_fill(staging.buf, lambda: self._read(plan, staging.buf))
        return self._copy_into_slot(slot, staging.buf, plan_nbytes(plan), slot_free)

    def _read(self, plan: ReadPlan, buf: torch.Tensor) -> None:
        t0 = time.perf_counter()
        changed = check_identity(plan)
        verify = plan.needs_checksums(changed)
        pool = self._chunks()
        futures = [pool.submit(read_chunk, plan, c, buf, verify) for c in plan.chunks]
        wait(futures)
        for f in futures:
            f.result()  # re-raises a truncated or corrupt chunk
        plan.accept(changed)
        self.counters.add(bytes_disk=plan.nbytes, disk_s=time.perf_counter() - t0)

    def _load_mapped(self, mapped: MappedGroup) -> None:
        t0 = time.perf_counter()
        nbytes = mapped.load()
        self.counters.add(bytes_disk=nbytes, disk_s=time.perf_counter() - t0)

    def _groups(self) -> ThreadPoolExecutor:
        if self._group_pool is None:
            self._group_pool = ThreadPoolExecutor(self.depth + 1, thread_name_prefix="ferry-load")
        return self._group_pool

    def _chunks(self) -> ThreadPoolExecutor:
        if self._chunk_pool is None:
            self._chunk_pool = ThreadPoolExecutor(
                self.read_threads, thread_name_prefix="ferry-read"
            )
        return self._chunk_pool

    def _drain(self) -> None:
        """Drops the prefetch window. Reads still running finish first: their buffers
        must not be refilled under them."""
        while self.window:
            load = self.window.popleft()
            if load.future is not None:
                try:
                    ready = load.future.result()
                except Exception:  # a read that will not be used; a later read reports it
                    ready = None
                if load.staging is not None and ready is not None:
                    load.staging.free = ready
            if load.group.mapped is not None and load.group is not self.current:
                load.group.mapped.unmap()
        self.next_step = self.step + 1

    def _abort(self) -> None:
        """After a forward raised: every tensor back on the host, nothing in flight."""
        self.in_forward = False
        self._release_current()
        self._drain()
        self.pos = None

    def _retrace(self) -> None:
        seen = {id(g) for g in self.observed}
        self.never_ran = [g.name for g in self.groups if id(g) not in seen]
        if self.never_ran and self.retraced == 0:
            log.warning(
                "ferry: %d offloaded group(s) did not run in the traced forward (%s); they "
                "stay offloaded and are loaded on demand if they ever run",
                len(self.never_ran),
                ", ".join(self.never_ran[:5]) + (" ..." if len(self.never_ran) > 5 else ""),
            )
        if self.observed:
            self.order = list(self.observed)
            self.retraced += 1
        self._drain()
        self.pos = -1
        self._top_up()

    # -- timings on devices that tell -----------------------------------------------------
    def _resolve_timings(self) -> None:
        with self.counters.lock:
            pending, self._timings = self._timings, []
        keep = []
        for kind, start, end in pending:
            if not end.query():
                keep.append((kind, start, end))
                continue
            seconds = start.elapsed_time(end) / 1000.0
            self.counters.add(**({"stall_s": seconds} if kind == "stall" else {"h2d_s": seconds}))
        with self.counters.lock:
            self._timings = keep + self._timings

    # -- teardown ---------------------------------------------------------------------------
    def quiesce(self) -> None:
        """Nothing in flight, every tensor on its host form."""
        self._release_current()
        self._drain()
        self.in_forward = False
        self.pos = None
        if self._timings:
            self.backend.host_wait(self.backend.record(self.backend.compute_stream()))
            self._resolve_timings()

    def uninstall(self) -> None:
        self.quiesce()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        for pool in (self._group_pool, self._chunk_pool):
            if pool is not None:
                pool.shutdown(wait=True)
        self._group_pool = self._chunk_pool = None
        for g in self.groups:
            for e in g.spec.entries:
                e.slot_forms.clear()
        self.slots.clear()
        for s in self.stagings:
            self.backend.release_host(s.buf)
        self.stagings.clear()


def plan_nbytes(plan: ReadPlan) -> int:
    return max((c.buf_offset + c.nbytes for c in plan.chunks), default=0)
