"""The interface the engine loads a streamed group through, which every kind of weight
source implements (sources/: one file per kind; sources/kinds.py chooses a group's).

A source is where one group's bytes wait while the group is not computing. The engine knows
sources only through ``WeightSource``; a group kept on the device is not a source the engine
sees, only bytes the placement holds (``HeldBytes``). docs/architecture.md says how to add a
source.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from ..disk.plan import ReadPlan
    from ..transfer.backend import Backend
    from ..transfer.buffers import Slot
    from ..transfer.copies import Transfers


class HeldBytes(Protocol):
    """Whatever holds a group's bytes while it is placed: given back on remove."""

    @property
    def file_plan(self) -> ReadPlan | None:
        """The checked file the bytes are read from (Ferry's group file or the user's
        checkpoint: what a repair rewrites, what a lost group's error names); None for
        bytes held in memory."""
        ...

    def host_bytes(self, nbytes: int) -> torch.Tensor:
        """The group's slab (``nbytes``), readable by ``copy_``: to restore the model."""
        ...

    def close(self, backend: Backend) -> None:
        """After restore: give back what the source holds (pinned memory, descriptors)."""
        ...


class WeightSource(HeldBytes, Protocol):
    #: False for a source the group computes from in place (a mapped file): no slot.
    uses_slot: bool

    def load(self, transfers: Transfers, slot: Slot | None) -> Future[Any]:
        """Starts bringing the group's bytes in (into ``slot`` when ``uses_slot``); returns
        the future of the ready-event compute waits on (None: nothing to wait on)."""
        ...

    def release(self) -> None:
        """The group's forward returned and it no longer computes from its bytes."""
        ...

    def discard(self) -> None:
        """A load that finished but will not be used (a misprediction, an abort)."""
        ...
