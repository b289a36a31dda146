"""Which group loads when: a small state machine in plain Python (no tensors, no threads).

[Note: the schedule]
Groups run in an ``order`` traced from the forwards themselves (the first guess is
registration order; a forward that runs groups in another order re-traces it). Every load
gets the next activation ``step``; step ``t`` uses buffer ``t % (depth + 1)``. While the
group of step ``t`` computes, the ``window`` holds the loads planned for steps
``t+1 .. t+depth``: the next groups of the order, wrapping past its end into the next
forward, so the first groups of a forward arrive while the previous forward's last groups
compute. Invariants, which tests/test_schedule.py checks after every transition:
  - the window holds at most ``depth`` loads, with consecutive steps starting at
    ``step + 1``, so the ``depth + 1`` buffers are never claimed twice (the one computing
    plus the window);
  - the window's positions follow ``cursor`` consecutively around the order;
  - ``cursor`` is the position of the group computing now, ``-1`` before a forward's first
    group, or None when nothing should be prefetched (after an abort or a group that is not
    in the order) until the next forward begins.
A group that is not the window's head (a misprediction) drops the whole window; the engine
waits for the dropped loads before their buffers are reused.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum


class Phase(Enum):
    IDLE = "idle"  # between forwards
    IN_FORWARD = "in_forward"


@dataclass(frozen=True)
class Planned:
    """A load the engine is to start: group ``group`` for activation ``step``."""

    step: int
    pos: int | None  # position in the order; None for a group outside it
    group: int


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
    order: list[int] = field(default_factory=list)
    window: deque[Planned] = field(default_factory=deque)
    phase: Phase = Phase.IDLE
    step: int = 0  # activation number of the group computing now (0: none yet)
    next_step: int = 1
    cursor: int | None = None
    observed: list[int] = field(default_factory=list)
    retraced: int = 0

    def __post_init__(self) -> None:
        if not self.order:
            self.order = list(range(self.n_groups))

    def buffer_of(self, step: int) -> int:
        return step % (self.depth + 1)

    # -- transitions ----------------------------------------------------------------------
    def begin_forward(self) -> list[Planned]:
        """A forward starts (the engine aborted any unfinished one first)."""
        assert self.phase is Phase.IDLE, "a forward began while the previous one was unfinished"
        self.phase = Phase.IN_FORWARD
        self.observed = []
        if self.window:
            return []  # the previous forward already prefetched this one's first groups
        self.cursor = -1
        return self.top_up()

    def take(self, group: int) -> Take:
        """Group ``group`` is about to compute."""
        if self.phase is Phase.IN_FORWARD:
            self.observed.append(group)
        if self.window and self.window[0].group == group:
            load, dropped, on_demand = self.window.popleft(), [], False
        else:
            pos = self._position_of(group)
            dropped = self.drop_window()
            load, on_demand = self._plan(pos, group), True
        self.step = load.step
        self.cursor = load.pos
        return Take(load, dropped, on_demand)

    def top_up(self) -> list[Planned]:
        """Plans loads until the window is full; returns them, to start in this order."""
        if self.cursor is None or not self.order:
            return []
        n = len(self.order)
        last = self.window[-1].pos if self.window else self.cursor
        planned = []
        while len(self.window) < self.depth and last is not None:
            last = (last + 1) % n
            planned.append(self._plan(last, self.order[last]))
            self.window.append(planned[-1])
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
        self.cursor = -1
        return never_ran, dropped, self.top_up()

    def abort(self) -> list[Planned]:
        """A forward raised, or the engine is being quiesced: nothing planned, nothing
        prefetched until the next forward begins. Returns the loads to drop."""
        self.phase = Phase.IDLE
        self.cursor = None
        return self.drop_window()

    def drop_window(self) -> list[Planned]:
        dropped = list(self.window)
        self.window.clear()
        self.next_step = self.step + 1
        return dropped

    # -- helpers ----------------------------------------------------------------------------
    def _plan(self, pos: int | None, group: int) -> Planned:
        planned = Planned(self.next_step, pos, group)
        self.next_step += 1
        return planned

    def _position_of(self, group: int) -> int | None:
        """The group's next position in the order after the cursor (None: not in it)."""
        n = len(self.order)
        start = (self.cursor + 1) if self.cursor is not None else 0
        for k in range(n):
            p = (start + k) % n
            if self.order[p] == group:
                return p
        return None
