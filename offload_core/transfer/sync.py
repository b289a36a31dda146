"""The CPU and MPS backend: one queue, so ordering holds without events."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from ..disk.host_memory import host_buffer

T = TypeVar("T")


class SyncBackend:
    """CPU (and MPS): one queue; events are unnecessary, copies are plain copies."""

    can_pin = False

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.synchronous = device.type == "cpu"

    def compute_stream(self) -> None:
        return None

    def copy_stream(self) -> None:
        return None

    def use_stream(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def record(self, stream: Any) -> None:
        return None

    def wait(self, stream: Any, event: Any) -> None:
        pass

    def host_wait(self, event: Any) -> None:
        # MPS queues copies asynchronously; before the host refills a buffer a copy may
        # still read, drain the queue. The CPU has nothing queued.
        if self.device.type == "mps":
            torch.mps.synchronize()

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=self.device.type != "cpu")

    def empty_device(self, nbytes: int) -> torch.Tensor:
        if self.device.type == "cpu":
            return host_buffer(nbytes)  # disk reads land here directly
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def empty_host(self, nbytes: int, pinned: bool) -> torch.Tensor:
        return host_buffer(nbytes)

    def release_host(self, buf: torch.Tensor) -> None:
        pass

    def register_host(self, buf: torch.Tensor) -> bool:
        return False  # nothing to pin for: the CPU reads host memory as it is

    def unregister_host(self, buf: torch.Tensor) -> None:
        pass

    def host_fill(self, dst: torch.Tensor, fill: Callable[[], T]) -> T:
        """The host (a reader thread) writes ``dst``; the test backend reports it."""
        return fill()

    def timing_pair(self) -> None:
        return None
