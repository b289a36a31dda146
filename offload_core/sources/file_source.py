"""A group read from a file into a slot each time it runs: Ferry's own group file or the
user's checkpoint (both a checked ReadPlan, disk/plan.py, read by the one reader)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import torch

from ..disk.plan import ReadPlan
from ..disk.reader import read_all

if TYPE_CHECKING:
    from ..transfer.backend import Backend
    from ..transfer.buffers import Slot
    from ..transfer.copies import Transfers


class FileSource:
    uses_slot = True

    def __init__(self, plan: ReadPlan) -> None:
        self.plan = plan

    def load(self, transfers: Transfers, slot: Slot | None) -> Future[Any]:
        assert slot is not None
        return transfers.read_file(self.plan, slot)

    def release(self) -> None:
        pass

    def discard(self) -> None:
        pass

    def host_bytes(self, nbytes: int) -> torch.Tensor:
        buf = torch.empty(nbytes, dtype=torch.uint8)
        read_all(self.plan, buf)
        return buf

    def close(self, backend: Backend) -> None:
        self.plan.close()
