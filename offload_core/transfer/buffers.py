"""Buffers the engine reuses, each stored beside the event that says when it is free.

See [Note: the three waits] in transfer/copies.py for who records and who waits on each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Slot:
    """The region of the device ring one streamed group computes from ([Note: the
    schedule]); the events that say when its bytes are free are kept by region in
    transfer/copies.py (wait 2)."""

    offset: int  # where ``buf`` starts in the ring
    buf: torch.Tensor


@dataclass
class Staging:
    """Pinned host memory a reader thread fills and the copy stream empties into a slot."""

    buf: torch.Tensor
    #: Event of the last copy out of it (None: never copied from, or a CPU).
    free: Any = None
