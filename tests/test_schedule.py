"""The schedule as a state machine: plain integers, no tensors, no threads.

Every transition is followed by a check of the invariants [Note: the schedule] states."""

from __future__ import annotations

import pytest

from offload_core.model.layout import PAGE
from offload_core.runtime.schedule import Phase, Planned, Schedule


def overlap(a: Planned, b: Planned) -> bool:
    return a.size > 0 and b.size > 0 and a.offset < b.end and b.offset < a.end


def check(s: Schedule) -> None:
    assert len(s.window) <= s.max_window
    steps = [p.step for p in s.window]
    assert steps == list(range(s.step + 1, s.step + 1 + len(steps))), (s.step, steps)
    if s.window:
        assert s.next_step == steps[-1] + 1
        n = len(s.order)
        prev = s.cursor
        for p in s.window:
            assert prev is not None and p.pos == (prev + 1) % n
            assert p.group == s.order[p.pos]
            prev = p.pos
    # The regions claimed (the one computing + the window) lie in the ring and are disjoint.
    live = s.live()
    assert s.current is None or s.current.step == s.step
    assert s.sizes is not None
    for r in live:
        assert r.offset % PAGE == 0 and r.offset >= 0 and r.end <= s.ring_bytes, r
        assert r.size == s.sizes[r.group]
    for i, a in enumerate(live):
        for b in live[i + 1 :]:
            assert not overlap(a, b), (a, b)


def run_forward(s: Schedule, groups: list[int]) -> tuple[list[Planned], list[Planned], int]:
    """Drives one forward; returns the loads started, the loads dropped, on-demand count."""
    started = s.begin_forward()
    check(s)
    dropped: list[Planned] = []
    on_demand = 0
    for g in groups:
        take = s.take(g)
        dropped += take.dropped
        on_demand += take.on_demand
        if take.on_demand:
            started.append(take.load)
        check(s)
        started += s.top_up()
        check(s)
        assert take.load.group == g
    if s.end_forward():
        _, d, planned = s.retrace()
        dropped += d
        started += planned
        check(s)
    assert s.phase is Phase.IDLE
    return started, dropped, on_demand


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_steady_state_prefetches_every_group_and_wraps_into_the_next_forward(depth):
    s = Schedule(5, depth)
    started, dropped, on_demand = run_forward(s, [0, 1, 2, 3, 4])
    assert dropped == [] and on_demand == 0
    # Every group of the first forward plus the next forward's first `depth` ones.
    assert [p.group for p in started] == [0, 1, 2, 3, 4, *[0, 1, 2][:depth]]
    started2, dropped2, od2 = run_forward(s, [0, 1, 2, 3, 4])
    assert dropped2 == [] and od2 == 0
    assert [p.group for p in started2] == [(depth + k) % 5 for k in range(5)]
    assert [p.step for p in started + started2] == list(range(1, 11 + depth))
    assert s.retraced == 0


def test_a_forward_in_another_order_retraces_once_and_then_predicts_it():
    s = Schedule(4, 2)
    run_forward(s, [0, 1, 2, 3])
    _, dropped, on_demand = run_forward(s, [0, 2, 1, 3])  # a different order
    assert on_demand >= 1 and dropped, "the misprediction dropped the window"
    assert s.order == [0, 2, 1, 3] and s.retraced == 1
    _, dropped, on_demand = run_forward(s, [0, 2, 1, 3])
    assert dropped == [] and on_demand == 0


def test_groups_that_never_ran_are_reported_and_loaded_on_demand():
    s = Schedule(4, 1)
    s.begin_forward()
    for g in [0, 1, 3]:
        s.take(g)
        s.top_up()
    assert s.end_forward()
    never_ran, _, _ = s.retrace()
    assert never_ran == [2] and s.order == [0, 1, 3]
    _, _, on_demand = run_forward(s, [0, 1, 2, 3])  # 2 runs again: not in the order
    assert on_demand >= 1


def test_abort_drops_everything_and_prefetches_nothing_until_the_next_forward():
    s = Schedule(3, 2)
    s.begin_forward()
    s.take(0)
    s.top_up()
    dropped = s.abort()
    assert [p.group for p in dropped] == [1, 2]
    assert s.top_up() == [] and not s.window
    started, d, od = run_forward(s, [0, 1, 2])
    assert [p.group for p in started][:3] == [0, 1, 2] and d == [] and od == 0


def test_a_group_outside_the_order_stops_prefetching_until_the_next_forward():
    s = Schedule(3, 1)
    s.order = [0, 1]  # group 2 is not in the traced order
    s.begin_forward()
    s.take(0)
    s.top_up()
    take = s.take(2)
    assert take.on_demand and take.load.pos is None and s.cursor is None
    assert s.top_up() == []


def test_begin_forward_refuses_an_unfinished_forward():
    s = Schedule(2, 1)
    s.begin_forward()
    with pytest.raises(AssertionError):
        s.begin_forward()
