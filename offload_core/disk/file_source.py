"""A group read from a file into a slot each time it runs: Ferry's own group file or the
user's checkpoint (both a checked ReadPlan, disk/plan.py, read by the one reader)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import torch

from .loads import Loads
from .plan import ReadPlan
from .reader import read_all


class FileSource:
    uses_slot = True

    def __init__(self, plan: ReadPlan) -> None:
        self.file_plan = plan

    def load(self, transfers: Loads, slot: Any) -> Future[Any]:
        assert slot is not None
        return transfers.read_file(self.file_plan, slot)

    def release(self) -> None:
        pass

    def discard(self) -> None:
        pass

    def host_bytes(self, nbytes: int) -> torch.Tensor:
        buf = torch.empty(nbytes, dtype=torch.uint8)
        read_all(self.file_plan, buf)
        return buf

    def close(self, backend: object) -> None:
        self.file_plan.close()
