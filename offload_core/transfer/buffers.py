"""Buffers the engine reuses, each stored beside the event that says when it is free.

See [Note: the three waits] in transfer/copies.py for who records and who waits on each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Slot:
    """A device buffer one streamed group computes from, sized for the largest group."""

    index: int
    buf: torch.Tensor
    #: Compute-done event of the group that last read it (None: never read, or a CPU).
    free: Any = None


@dataclass
class Staging:
    """Pinned host memory a reader thread fills and the copy stream empties into a slot."""

    buf: torch.Tensor
    #: Event of the last copy out of it (None: never copied from, or a CPU).
    free: Any = None
