"""One small surface for every stream, event and allocation call the engine makes.

Three implementations share it:
- ``StreamBackend`` (transfer/streams.py: CUDA, ROCm, XPU): a side copy stream, real events;
- ``SyncBackend`` (transfer/sync.py: CPU, MPS): one queue, so ordering holds without events;
- a test backend (tests/sanitizer_backend.py) that feeds PyTorch's CUDA-Sanitizer engine with
  the same calls, so stream ordering is proven on a CPU machine.
Which calls are made when is [Note: the three waits] in transfer/copies.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import torch

T = TypeVar("T")


class Backend(Protocol):
    device: torch.device
    #: True when the onload device runs on the host's own timeline (CPU): no copy stream,
    #: reads can land straight in a device slot.
    synchronous: bool
    #: True when pinned host memory exists on this device type.
    can_pin: bool

    def compute_stream(self) -> Any: ...
    def copy_stream(self) -> Any: ...
    def use_stream(self, stream: Any) -> contextlib.AbstractContextManager[Any]: ...
    def record(self, stream: Any) -> Any: ...
    def wait(self, stream: Any, event: Any) -> None: ...
    def host_wait(self, event: Any) -> None: ...
    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None: ...
    def empty_device(self, nbytes: int) -> torch.Tensor: ...
    def empty_host(self, nbytes: int, pinned: bool) -> torch.Tensor: ...
    def release_host(self, buf: torch.Tensor) -> None: ...
    #: Pins host memory the backend did not allocate (a shared segment's read-only view),
    #: exactly its range; False where this device or platform cannot (copies then go through
    #: the staging ring). ``unregister_host`` undoes it before the memory is unmapped.
    def register_host(self, buf: torch.Tensor) -> bool: ...
    def unregister_host(self, buf: torch.Tensor) -> None: ...
    def host_fill(self, dst: torch.Tensor, fill: Callable[[], T]) -> T: ...
    def timing_pair(self) -> tuple[Any, Any] | None: ...


def backend_for(device: torch.device) -> Backend:
    from .streams import StreamBackend
    from .sync import SyncBackend

    if device.type in ("cuda", "xpu"):
        return StreamBackend(device)
    if device.type in ("cpu", "mps"):
        return SyncBackend(device)
    raise ValueError(f"onload_device {device} is not supported; use cuda, xpu, mps or cpu")
