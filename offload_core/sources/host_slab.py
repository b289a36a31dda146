"""A group's slab in RAM, pinned (fast, asynchronous copies) or plain (copied to a device
through the pinned staging ring: [Note: the RAM tier through staging] in transfer/copies.py)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ..transfer.backend import Backend
    from ..transfer.buffers import Slot
    from ..transfer.copies import Transfers


class HostSlabSource:
    uses_slot = True
    file_plan = None  # its bytes are in memory: no file

    def __init__(self, slab: torch.Tensor, pinned: bool = False) -> None:
        self.slab = slab
        self.pinned = pinned

    def load(self, transfers: Transfers, slot: Slot | None) -> Future[Any]:
        assert slot is not None
        return transfers.copy_slab(slot, self.slab, self.slab.numel(), self.pinned)

    def release(self) -> None:
        pass

    def discard(self) -> None:
        pass

    def host_bytes(self, nbytes: int) -> torch.Tensor:
        return self.slab

    def close(self, backend: Backend) -> None:
        backend.release_host(self.slab)
