"""The runtime: hooks that bring each group in just before it runs.

The engine glues three parts together and holds no policy of its own:
- the schedule (runtime/schedule.py, [Note: the schedule]) says which load starts when;
- each group's source (sources/) starts a load and says when its bytes are in;
- the transfers (transfer/copies.py, [Note: the three waits]) own the slots, the copies and
  every wait.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import CorruptGroupFileError, InferenceOnlyError
from ..transfer.backend import Backend
from ..transfer.buffers import Slot
from ..transfer.copies import Transfers
from .group import GroupRuntime
from .group_states import GroupState
from .memory import HeapTrimmer, computes_from_copies
from .schedule import Phase, Planned, Schedule
from .stats import Counters

log = logging.getLogger("ferry")


@dataclass
class Load:
    """A group on its way in: the slot it lands in travels with its ready-event."""

    planned: Planned
    group: GroupRuntime
    slot: Slot | None  # None for a source computed in place (a mapped file)
    ready: Future[Any]


def _arrived(ready: Future[Any]) -> bool:
    """Whether a load's bytes are in, asked without waiting: its reader is done, and on an
    accelerator the copy it issued (the device event its future holds) has completed. A
    failed read is not in (the engine raises it, or repairs the group, when it takes it)."""
    if not ready.done() or ready.exception() is not None:
        return False
    query = getattr(ready.result(), "query", None)  # a device event; None on a CPU
    return query is None or bool(query())


class Engine:
    def __init__(
        self,
        root: nn.Module,
        groups: list[GroupRuntime],
        backend: Backend,
        prefetch_depth: int,
        counters: Counters,
        staged: bool,
        repair: Callable[[GroupRuntime], bool] | None = None,
        read_threads: int = 4,
    ) -> None:
        self.root = root
        #: Rewrites a damaged group's file from its source of truth (disk/repair.py).
        self.repair = repair
        self.groups = groups
        self.counters = counters
        # Every group's bytes count in the ring, slot or not: a mapped group's pages are
        # the RAM its prefetch holds.
        self.schedule = Schedule(len(groups), prefetch_depth, [g.spec.nbytes for g in groups])
        slotted = any(g.source.uses_slot for g in groups)
        slot_bytes = max((g.spec.nbytes for g in groups if g.source.uses_slot), default=0)
        self.transfers = Transfers(
            backend,
            counters,
            self.schedule.ring_bytes if slotted else 0,
            (prefetch_depth + 1, slot_bytes) if staged else None,
            read_threads,
        )
        self._ids = {id(g): i for i, g in enumerate(groups)}  # a group's number in the schedule
        #: The groups whose forward frees per-call copies of their weights, on a host that
        #: computes ([Note: the heap trim on the forward path] in runtime/memory.py).
        self._trimmed = {
            id(g) for g in groups if backend.synchronous and computes_from_copies(g.spec.entries)
        }
        self._trimmer = HeapTrimmer()
        self.inflight: dict[int, Load] = {}  # by step: the loads the schedule planned
        #: The load computing now: its group and the slot its tensors point into, which
        #: ``_release_current`` gives back. Not the schedule's ``current`` (the same region,
        #: ``load.planned``): the schedule reserves it from ``take`` on, this is set only once
        #: the load's bytes are in, so a failed activation has nothing to give back while its
        #: region stays reserved until the abort.
        self.current: Load | None = None
        self.never_ran: list[str] = []
        self._hooks: list[Any] = []
        #: How deep in passes the host marked (``one_pass``); while > 0 the root's own
        #: hooks do nothing ([Note: a pass the host marks]).
        self._marked = 0

    # -- hooks ----------------------------------------------------------------------------
    def install(self) -> None:
        # Under torch.compile the hooks run eagerly (a graph break per group): they swap
        # tensors and wait on events, which a graph must not capture.
        eager = torch.compiler.disable
        for g in self.groups:
            for _, m in g.spec.modules:
                self._hooks.append(m.register_forward_pre_hook(eager(self._pre_hook_for(g))))
        self._hooks.append(self.root.register_forward_pre_hook(eager(self._root_pre)))
        self._hooks.append(
            self.root.register_forward_hook(eager(self._root_post), always_call=True)
        )

    def _pre_hook_for(self, g: GroupRuntime) -> Callable[..., None]:
        def pre_hook(module: nn.Module, args: Any) -> None:
            self.enter(g)

        return pre_hook

    def _root_pre(self, module: nn.Module, args: Any) -> None:
        if not self._marked:
            self._begin_pass()

    def _root_post(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._marked:
            return
        if sys.exc_info()[0] is not None:
            self._abort()
            return
        self._end_pass()

    @contextlib.contextmanager
    def one_pass(self) -> Iterator[None]:
        """[Note: a pass the host marks]
        A pass (what the schedule traces, predicts and counts as one forward) is the root's
        forward, seen by its hooks. Some hosts never call the root: ComfyUI encodes a prompt
        with ``cond_stage_model.encode_token_weights``, which calls each encoder (CLIP-L, then
        T5) but not the CLIP model around them. Without a pass the schedule never traces an
        order (it assumes the module order), nothing counts, and the last group stays in its
        slot until the next encode. Such a host marks the pass around its call; inside it the
        root's own hooks do nothing, and a pass marked inside another is part of it."""
        if self._marked:
            self._marked += 1
            try:
                yield
            finally:
                self._marked -= 1
            return
        self._begin_pass()
        self._marked = 1
        try:
            yield
        except BaseException:
            self._marked = 0
            self._abort()
            raise
        self._marked = 0
        self._end_pass()

    def _begin_pass(self) -> None:
        if self.schedule.phase is Phase.IN_FORWARD:
            # The previous forward never reached its end (KeyboardInterrupt skips hooks).
            self._abort()
        self._release_current()
        self._start(self.schedule.begin_forward())

    def _end_pass(self) -> None:
        self._release_current()
        self.counters.add(forwards=1)
        self.counters.sample_rss()
        if self.schedule.end_forward():
            self._retrace()
        self.transfers.resolve_timings()

    # -- the schedule, carried out ------------------------------------------------------------
    def enter(self, g: GroupRuntime) -> None:
        if self.current is not None and g is self.current.group:
            return
        if torch.is_grad_enabled() and g.requires_grad:
            raise InferenceOnlyError(
                f"group {g.name} has parameters that require grad and autograd is on: Ferry's "
                "offload is for inference. Run the model under torch.no_grad() or "
                "torch.inference_mode(), or call model.requires_grad_(False)"
            )
        self._release_current()
        take = self.schedule.take(self._ids[id(g)])
        self._drop(take.dropped)
        if take.on_demand:
            self.counters.add(on_demand_loads=1)
            self._start([take.load])
        self._activate(self.inflight.pop(take.load.step))
        self._start(self.schedule.top_up())

    def _start(self, planned: list[Planned]) -> None:
        for p in planned:
            g = self.groups[p.group]
            slot = self.transfers.slot_at(p.offset, p.size) if g.source.uses_slot else None
            ready = g.source.load(self.transfers, slot)
            self.inflight[p.step] = Load(p, g, slot, ready)

    def _activate(self, load: Load) -> None:
        try:
            self.transfers.wait_ready(load.ready)  # wait 1; re-raises a failed read
        except CorruptGroupFileError:
            # Its bytes were never used; where a source of truth exists the file is rewritten
            # and read again, so this forward goes on ([Note: repairing a group under the
            # engine] in disk/repair.py).
            if self.repair is None or not self.repair(load.group):
                raise
            g = load.group
            load.ready = g.source.load(self.transfers, load.slot)
            self.transfers.wait_ready(load.ready)
        if load.slot is not None:
            load.group.to_slot(load.slot)
        self.current = load

    def _release_current(self) -> None:
        load, self.current = self.current, None
        if load is None:
            return
        if load.slot is not None:
            self.transfers.slot_done(load.slot)
            load.group.to_host()
        load.group.source.release()  # a mapped group's pages go (its forward has returned)
        if id(load.group) in self._trimmed:
            self._trimmer.freed(load.group.spec.nbytes)

    def _drop(self, planned: list[Planned]) -> None:
        """Loads that will not be used. Reads still running finish first: their regions
        must not be refilled under them (the schedule reuses them at once)."""
        for p in planned:
            load = self.inflight.pop(p.step)
            try:
                load.ready.result()
            except Exception as e:  # the read is not used; a later read of it reports it
                log.debug("ferry: a dropped prefetch of %s failed: %s", load.group.name, e)
            if self.current is None or load.group is not self.current.group:
                load.group.source.discard()

    def _abort(self) -> None:
        """After a forward raised: every tensor back on the host, nothing in flight."""
        self._release_current()
        self._drop(self.schedule.abort())

    def _retrace(self) -> None:
        first = self.schedule.retraced == 0
        never_ran, dropped, planned = self.schedule.retrace()
        self.never_ran = [self.groups[i].name for i in never_ran]
        if self.never_ran and first:
            log.warning(
                "ferry: %d offloaded group(s) did not run in the traced forward (%s); they "
                "stay offloaded and are loaded on demand if they ever run",
                len(self.never_ran),
                ", ".join(self.never_ran[:5]) + (" ..." if len(self.never_ran) > 5 else ""),
            )
        self._drop(dropped)
        self._start(planned)

    # -- what a UI shows ----------------------------------------------------------------------
    def group_states(self) -> list[GroupState]:
        """Each streamed group's state now (group_states.py), for a reader on another
        thread: the dict and the current load are read once each (a copy under the GIL), so
        a transition on the compute thread meanwhile gives a state a moment old, never an
        error."""
        current = self.current
        loads = list(self.inflight.values())
        states = [GroupState.WAITING] * len(self.groups)
        for load in loads:
            i = self._ids.get(id(load.group))
            if i is not None:
                # A group planned twice (a short order wrapping) is in once one load is.
                arrived = _arrived(load.ready) or states[i] is GroupState.ON_DEVICE
                states[i] = GroupState.ON_DEVICE if arrived else GroupState.IN_FLIGHT
        if current is not None:
            states[self._ids[id(current.group)]] = GroupState.ON_DEVICE
        return states

    # -- teardown -------------------------------------------------------------------------
    def quiesce(self) -> None:
        """Nothing in flight, every tensor on its host form."""
        self._abort()
        self.transfers.settle()  # dropped loads' copies too: their host buffers go next
        self.transfers.flush_timings()

    def uninstall(self) -> None:
        try:
            self.quiesce()  # a mapped group's release can find its file damaged
        finally:
            self._unhook()

    def _unhook(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self.transfers.close()
        for g in self.groups:
            for e in g.spec.entries:
                e.slot_forms.clear()
