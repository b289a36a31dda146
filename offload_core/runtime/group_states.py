"""Where each group of an offload is at one instant, as the UIs draw it (a strip of cells).

Read from the engine's own bookkeeping (the load computing now, the loads in flight and
whether their bytes are in), never from the tensors: a stats reader on another thread
costs a few dict reads, whatever the model's size.

The strip is a string, one letter per group in the plan's order (small to push once a
second, and the same for every UI):
  ``r`` resident: kept on the onload device for the whole run;
  ``d`` on the device: computing now, or its bytes are in and it computes next;
  ``f`` in flight: its load has started and its bytes are not all in yet;
  ``w`` waiting: in its tier (pinned RAM, RAM or disk), nothing started.
"""

from __future__ import annotations

from enum import Enum


class GroupState(str, Enum):
    RESIDENT = "r"
    ON_DEVICE = "d"
    IN_FLIGHT = "f"
    WAITING = "w"


def strip(resident: list[bool], streamed: list[GroupState]) -> str:
    """The plan's groups in order (``resident``: whether each stays on the device), with the
    streamed ones' states in their order, as one letter each."""
    states = iter(streamed)
    out = []
    for keeps in resident:
        out.append(GroupState.RESIDENT.value if keeps else next(states, GroupState.WAITING).value)
    return "".join(out)
