"""A group kept on the onload device (a VRAM budget): never streamed, never loaded."""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ..transfer.backend import Backend
    from ..transfer.buffers import Slot
    from ..transfer.copies import Transfers


class ResidentSource:
    uses_slot = False

    def __init__(self, buf: torch.Tensor) -> None:
        self.buf = buf

    def load(self, transfers: Transfers, slot: Slot | None, step: int) -> Future[Any]:
        raise AssertionError("a resident group is never loaded: the engine does not see it")

    def release(self) -> None:
        pass

    def discard(self) -> None:
        pass

    def host_bytes(self, nbytes: int) -> torch.Tensor:
        return self.buf

    def close(self, backend: Backend) -> None:
        pass
