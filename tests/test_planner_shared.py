"""The planner and the shared RAM tier (issue 49): a network another process already holds on
the shared tier adds no RAM here (its bytes count once per machine), and the plan says so."""

from __future__ import annotations

from offload_core.planner import Wish, plan_graph
from offload_core.units import GIB

from .test_planner import dm, gpu, te

SHARED = Wish(tier="shared")


def test_shared_bytes_count_once_per_machine() -> None:
    first = plan_graph(gpu(8, 64, 40), [dm(12, wish=SHARED)]).choices[0]
    second = plan_graph(gpu(8, 64, 40), [dm(12, wish=SHARED, shared_with=1)]).choices[0]
    assert first.tier == second.tier == "shared"
    assert first.ram_bytes >= 12 * GIB  # this process makes the machine's one copy
    assert second.ram_bytes < GIB  # already in RAM: nothing added
    assert "counted whole here" in first.reason
    assert "shared with 1 other process:" in second.reason
    assert (
        "shared with 3 other processes"
        in plan_graph(gpu(8, 64, 40), [dm(12, wish=SHARED, shared_with=3)]).choices[0].reason
    )


def test_a_shared_network_leaves_room_for_the_others() -> None:
    """20 GB of RAM: a 12 GB diffusion model another process holds on the shared tier leaves
    the 9 GB text encoder in RAM; the same model made here sends it to disk."""
    held = plan_graph(gpu(8, 20, 40), [te(), dm(12, wish=SHARED, shared_with=1)])
    made = plan_graph(gpu(8, 20, 40), [te(), dm(12, wish=SHARED)])
    assert held.choices[0].tier != "disk" and made.choices[0].tier == "disk"
