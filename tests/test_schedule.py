"""The schedule as a state machine: plain integers, no tensors, no threads.

Every transition is followed by a check of the invariants [Note: the schedule] states."""

from __future__ import annotations

import itertools
import random

import pytest

from offload_core.errors import FerryError
from offload_core.runtime.schedule import WINDOW_PER_DEPTH, Phase, Planned, Prefetch, Schedule
from offload_core.units import PAGE


def overlap(a: Planned, b: Planned) -> bool:
    return a.size > 0 and b.size > 0 and a.offset < b.end and b.offset < a.end


def check(s: Schedule) -> None:
    assert len(s.window) <= s.max_window
    steps = [p.step for p in s.window]
    assert steps == list(range(s.step + 1, s.step + 1 + len(steps))), (s.step, steps)
    if s.window:
        assert s.next_step == steps[-1] + 1
        n = len(s.order)
        assert s.prefetch is not Prefetch.STOPPED
        expected = s.first_position()
        for p in s.window:
            assert p.pos == expected
            assert p.group == s.order[p.pos]
            expected = (p.pos + 1) % n
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
        if s.prefetch is not Prefetch.STOPPED:  # never fewer loads ahead than by count
            assert len(s.window) >= min(s.depth, s.max_window)
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
    assert take.on_demand and take.load.pos is None and s.prefetch is Prefetch.STOPPED
    assert s.top_up() == []


def test_begin_forward_refuses_an_unfinished_forward():
    s = Schedule(2, 1)
    s.begin_forward()
    with pytest.raises(FerryError, match="a forward began while the previous one was unfinished"):
        s.begin_forward()


# -- by bytes: groups of different sizes share the ring -------------------------------------
P = PAGE
#: A leaf-level pattern: a big Linear, quarter-size ones, a few-KB norm, a half-size one.
UNEVEN = [64 * P, 16 * P, 17 * P, 2 * P, 16 * P, 17 * P, 63 * P, 1, 32 * P, 33 * P, 1, 16 * P]


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_equal_groups_are_prefetched_exactly_by_count(depth):
    s = Schedule(6, depth, [10 * P + 5] * 6)
    assert s.ring_bytes == (depth + 1) * 11 * P
    started, dropped, on_demand = run_forward(s, list(range(6)))
    for _ in range(2):
        more, d, od = run_forward(s, list(range(6)))
        started += more
        dropped += d
        on_demand += od
    assert dropped == [] and on_demand == 0
    # Step t lands in slot (t - 1) % (depth + 1): the count-based schedule's buffers.
    assert [p.offset for p in started] == [(p.step - 1) % (depth + 1) * 11 * P for p in started]
    assert len(s.window) == depth


@pytest.mark.parametrize("depth", [1, 2])
def test_smaller_groups_are_prefetched_further_ahead(depth):
    s = Schedule(len(UNEVEN), depth, UNEVEN)
    widest = 0
    s.begin_forward()
    for _ in range(3):
        for g in range(len(UNEVEN)):
            s.take(g)
            s.top_up()
            check(s)
            widest = max(widest, len(s.window))
        s.end_forward()
        s.begin_forward()
    assert widest > depth, "small groups share a slot"
    assert sum(p.size for p in s.live()) <= s.ring_bytes


def test_regions_wrap_past_the_rings_end_and_overlap_only_released_ones():
    s = Schedule(len(UNEVEN), 1, UNEVEN)
    started, _, _ = run_forward(s, list(range(len(UNEVEN))))
    started += run_forward(s, list(range(len(UNEVEN))))[0]
    offsets = [p.offset for p in started]
    assert any(b < a for a, b in itertools.pairwise(offsets)), "the arc wrapped to slot 0"
    # Some region lies over two or more earlier ones (the case wait 2 waits on several events).
    over = [
        sum(overlap(p, q) for q in started[:i] if q.group != p.group) for i, p in enumerate(started)
    ]
    assert max(over) >= 2


def test_tiny_groups_fill_the_window_up_to_its_cap():
    s = Schedule(40, 1, [16 * P] + [1] * 39)  # a page each
    s.begin_forward()
    s.take(0)
    s.top_up()
    check(s)
    assert len(s.window) == s.max_window == WINDOW_PER_DEPTH


@pytest.mark.parametrize("depth", [1, 2])
def test_misprediction_retrace_and_abort_with_uneven_groups(depth):
    s = Schedule(len(UNEVEN), depth, UNEVEN)
    order = list(range(len(UNEVEN)))
    run_forward(s, order)
    shuffled = order[6:] + order[:6]
    _, dropped, on_demand = run_forward(s, shuffled)
    assert dropped and on_demand >= 1 and s.order == shuffled
    _, dropped, on_demand = run_forward(s, shuffled)
    assert dropped == [] and on_demand == 0
    s.begin_forward()
    s.take(shuffled[0])
    s.top_up()
    assert s.abort() and not s.window and s.current is None
    check(s)
    _, dropped, on_demand = run_forward(s, shuffled)
    assert dropped == [] and on_demand == 0


@pytest.mark.parametrize("seed", range(20))
def test_random_transitions_keep_the_regions_apart(seed):
    """Random sizes, orders, groups taken out of order, aborts and retraces: every state
    satisfies the invariants."""
    rng = random.Random(seed)
    n = rng.randint(2, 12)
    s = Schedule(
        n, rng.randint(1, 4), [rng.choice([1, P, 3 * P, 20 * P, 64 * P]) for _ in range(n)]
    )
    for _ in range(8):
        s.begin_forward()
        check(s)
        for _ in range(rng.randint(0, 2 * n)):
            nxt = s.order[s.first_position()]
            s.take(rng.randrange(n) if rng.random() < 0.2 else nxt)
            check(s)
            s.top_up()
            check(s)
            if s.prefetch is not Prefetch.STOPPED:
                assert len(s.window) >= min(s.depth, s.max_window)
        if rng.random() < 0.2:
            s.abort()
            check(s)
            continue
        if s.end_forward():
            s.retrace()
            check(s)
