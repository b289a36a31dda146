"""Which group loads when: a small state machine in plain Python (no tensors, no threads).

[Note: the schedule]
Groups run in an ``order`` traced from the forwards themselves (the first guess is
registration order; a forward that runs groups in another order re-traces it). Every load
gets the next activation ``step``. While the group of step ``t`` computes, the ``window``
holds the loads planned for steps ``t+1 ..``: the next groups of the order, wrapping past its
end into the next forward, so the first groups of a forward arrive while the previous
forward's last groups compute.

Prefetch is by bytes, not only by count. The device memory is one ring of ``depth + 1``
slots of the largest group's size (``ring_bytes``: the memory of ``depth + 1`` slots by count,
so ``depth`` groups ahead at the largest size, more when they are smaller), and every load gets
a ``region`` of it: page-aligned, allocated in step order at the head (right after the newest
live region while it fits in that region's slot, else at the start of the next slot, wrapping
past the ring's end to slot 0) and freed in step order, so the live regions (the group
computing now, then the window) form one FIFO arc. A load is planned only while the window
holds fewer than ``max_window`` loads (a generous cap) and its region overlaps no
live one. No region crosses a slot boundary, so the live arc spans at most ``depth + 1``
slots, each holding at least one region: the window always reaches ``depth`` loads when the
cap allows (as by count; a free ring, where a region straddles the middle, could leave no room
for the next group at depth 1), and with equal groups it is exactly by count.
Invariants, which tests/test_schedule.py checks after every transition:
  - the window holds at most ``max_window`` loads, with consecutive steps starting at
    ``step + 1`` (``step``: the step of the load taken last, ``taken``);
  - no two live regions (the one computing, ``current``, and the window's) overlap, and each
    lies inside the ring: a region is never written while a group that has not been
    released yet reads it. Regions of earlier (released) steps may be overlapped: the copy
    waits for their compute-done events ([Note: the three waits], wait 2);
  - after ``top_up`` (while prefetching), the window holds at least ``min(depth,
    max_window)`` loads: never fewer ahead than by count;
  - the window's positions follow ``first_position()`` consecutively around the order;
  - what is planned next is a state (``Prefetch``): FOLLOWING the load taken last (planning
    goes on after its position), FROM_START before a forward's first group (from the
    order's start), or STOPPED until the next forward begins, after an abort or a group
    that is not in the order (nothing is planned).
The group computing now is held once, as the load taken last (``taken``: its step, position
and region) while its region is live (``computing``); ``current`` and ``step`` are read from
it. The engine releases the group computing now (records its compute-done event) before every
transition that plans (``take``, ``begin_forward``, ``retrace``, ``abort``), which therefore
end ``computing``: its region is free, while its step and position still say where the
schedule is (the next step is numbered after it; a FOLLOWING schedule plans after it). A group that is not the window's head (a misprediction) drops the whole
window; the engine waits for the dropped loads before their regions are reused.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from ..errors import FerryError
from ..model.layout import align_up
from ..units import PAGE

#: The window's count cap, per unit of depth: generous, as bytes limit it first; it bounds the
#: loads queued on the load thread.
WINDOW_PER_DEPTH = 8


class Phase(Enum):
    IDLE = "idle"  # between forwards
    IN_FORWARD = "in_forward"


class Prefetch(Enum):
    """What the schedule plans next."""

    STOPPED = "stopped"  # nothing, until the next forward begins
    FROM_START = "from_start"  # the order's first group (a forward is beginning)
    FOLLOWING = "following"  # the groups after the load taken last (``Schedule.taken``)


@dataclass(frozen=True)
class Planned:
    """A load the engine is to start: group ``group`` for activation ``step``."""

    step: int
    pos: int | None  # position in the order; None for a group outside it
    group: int
    offset: int = 0  # the region of the ring it lands in: ``offset`` .. ``offset + size``
    size: int = 0

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(frozen=True)
class Take:
    """What entering a group means: the load to activate, and the loads to drop first."""

    load: Planned
    dropped: list[Planned]
    on_demand: bool  # the load was not prefetched: it starts now


@dataclass
class Schedule:
    n_groups: int
    depth: int
    #: Each group's bytes (None: all equal, one page each), rounded up to pages.
    sizes: list[int] | None = None
    order: list[int] = field(default_factory=list)
    window: deque[Planned] = field(default_factory=deque)
    phase: Phase = Phase.IDLE
    next_step: int = 1
    prefetch: Prefetch = Prefetch.STOPPED
    observed: list[int] = field(default_factory=list)
    retraced: int = 0
    #: The load taken last: the group computing now while ``computing`` (its region is
    #: live); after its release, still where the schedule stands (its step and position).
    taken: Planned | None = None
    computing: bool = False

    def __post_init__(self) -> None:
        if not self.order:
            self.order = list(range(self.n_groups))
        if self.sizes is None:
            self.sizes = [PAGE] * self.n_groups
        self.sizes = [align_up(n, PAGE) for n in self.sizes]
        self.slot_bytes = max(self.sizes, default=0)
        self.ring_bytes = (self.depth + 1) * self.slot_bytes
        self.max_window = WINDOW_PER_DEPTH * self.depth

    @property
    def current(self) -> Planned | None:
        """The load of the group computing now (its region is live); None once released."""
        return self.taken if self.computing else None

    @property
    def step(self) -> int:
        """The activation number of the load taken last (0: none yet)."""
        return self.taken.step if self.taken is not None else 0

    def first_position(self) -> int:
        """Where in the order planning (or a search for a group) begins: right after the
        load taken last while FOLLOWING it, else at the order's start."""
        if self.prefetch is Prefetch.FOLLOWING:
            assert self.taken is not None and self.taken.pos is not None  # see take()
            return (self.taken.pos + 1) % len(self.order)
        return 0

    def live(self) -> list[Planned]:
        """The regions in use, oldest first: the group computing now, then the window."""
        return ([self.current] if self.current is not None else []) + list(self.window)

    # -- transitions ----------------------------------------------------------------------
    def begin_forward(self) -> list[Planned]:
        """A forward starts (the engine aborted any unfinished one first)."""
        if self.phase is not Phase.IDLE:
            # The engine aborts an unfinished forward first (its root pre-hook); reaching
            # here means it did not, and planning on would put loads over live regions. An
            # error, not an assert, so that ``python -O`` keeps the check.
            raise FerryError(
                "a forward began while the previous one was unfinished and not aborted: "
                "a bug in Ferry's offload engine"
            )
        self.phase = Phase.IN_FORWARD
        self.observed = []
        self.computing = False  # released by the engine before
        if self.window:
            return []  # the previous forward already prefetched this one's first groups
        self.prefetch = Prefetch.FROM_START
        return self.top_up()

    def take(self, group: int) -> Take:
        """Group ``group`` is about to compute."""
        self.computing = False  # the engine released the group before: its region is free
        if self.phase is Phase.IN_FORWARD:
            self.observed.append(group)
        if self.window and self.window[0].group == group:
            load, dropped, on_demand = self.window.popleft(), [], False
        else:
            pos = self._position_of(group)
            dropped = self.drop_window()
            load, on_demand = self._plan(pos, group), True
        self.taken, self.computing = load, True
        # A group outside the order leaves nothing to follow.
        self.prefetch = Prefetch.STOPPED if load.pos is None else Prefetch.FOLLOWING
        return Take(load, dropped, on_demand)

    def top_up(self) -> list[Planned]:
        """Plans loads until the window is full; returns them, to start in this order."""
        if self.prefetch is Prefetch.STOPPED or not self.order:
            return []
        n = len(self.order)
        pos = self.first_position()
        if self.window:
            last = self.window[-1].pos
            assert last is not None  # the window's loads were planned in the order
            pos = (last + 1) % n
        planned = []
        while len(self.window) < self.max_window:
            offset = self._fit(self.order[pos])
            if offset is None:
                break  # the ring is full up to the region of the group computing now
            planned.append(self._plan(pos, self.order[pos], offset))
            self.window.append(planned[-1])
            pos = (pos + 1) % n
        return planned

    def end_forward(self) -> bool:
        """The forward returned; True when it ran another order than the traced one."""
        self.phase = Phase.IDLE
        return self.observed != self.order

    def retrace(self) -> tuple[list[int], list[Planned], list[Planned]]:
        """Adopts the order just observed. Returns the groups that never ran, the loads to
        drop, and the loads to start for the next forward."""
        seen = set(self.observed)
        never_ran = [g for g in range(self.n_groups) if g not in seen]
        if self.observed:
            self.order = list(self.observed)
            self.retraced += 1
        dropped = self.drop_window()
        self.prefetch = Prefetch.FROM_START
        self.computing = False  # the forward's last group was released before
        return never_ran, dropped, self.top_up()

    def abort(self) -> list[Planned]:
        """A forward raised, or the engine is being quiesced: nothing planned, nothing
        prefetched until the next forward begins. Returns the loads to drop."""
        self.phase = Phase.IDLE
        self.prefetch = Prefetch.STOPPED
        self.computing = False
        return self.drop_window()

    def drop_window(self) -> list[Planned]:
        dropped = list(self.window)
        self.window.clear()
        self.next_step = self.step + 1
        return dropped

    # -- helpers ----------------------------------------------------------------------------
    def _plan(self, pos: int | None, group: int, offset: int | None = None) -> Planned:
        """The load of ``group`` for the next step; ``offset`` None: one taken on demand,
        which goes after the live regions (there are none: the group before it is released
        and the window dropped)."""
        if offset is None:
            offset = self._fit(group)
            assert offset is not None, "an on-demand load found the ring in use"
        assert self.sizes is not None
        planned = Planned(self.next_step, pos, group, offset, self.sizes[group])
        self.next_step += 1
        return planned

    def _fit(self, group: int) -> int | None:
        """Where the group's region goes: after the newest live region if it fits in that
        region's slot, else at the next slot's start; None when that overlaps a live region."""
        assert self.sizes is not None
        size, live, m = self.sizes[group], self.live(), self.slot_bytes
        if not live or m == 0:
            return 0
        newest = live[-1]
        k = min(newest.offset // m, self.depth)  # its slot
        next_slot = (k + 1) % (self.depth + 1) * m
        offset = newest.end if newest.end + size <= (k + 1) * m else next_slot
        end = offset + size
        for r in live:
            if r.size and size and offset < r.end and r.offset < end:
                return None
        return offset

    def _position_of(self, group: int) -> int | None:
        """The group's next position in the order from ``first_position`` on (None: not in
        it)."""
        n = len(self.order)
        start = self.first_position() if n else 0
        for k in range(n):
            p = (start + k) % n
            if self.order[p] == group:
                return p
        return None
