"""Every stream, event and allocation call of the engine goes through one backend object.

Three implementations share one small surface:
- ``StreamBackend`` (CUDA, ROCm, XPU): a side copy stream and real events;
- ``SyncBackend`` (CPU, MPS): one queue, so ordering holds without events;
- a test backend (tests/sanitizer_backend.py) that feeds PyTorch's CUDA-Sanitizer engine with
  the same calls, so stream ordering is proven on a CPU machine.

[Note: who waits on what]
A device slot is written by the copy stream and read by the compute stream; a pinned staging
buffer is written by the host (a reader thread) and read by the copy stream. Three waits keep
that safe, and nothing else on the hot path blocks:
  1. compute waits on the copy's ready-event before a group's forward reads the slot;
  2. the copy stream waits on the compute-done event of the slot's previous group before it
     overwrites the slot;
  3. the host waits on the copy's event before it refills a staging buffer.
Each event is recorded on the stream that did the work (seed 001) and the consumer stream is
looked up when the wait is issued, never cached (seed 004).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

import torch

from ..model.layout import page_aligned_empty

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
    def host_fill(self, dst: torch.Tensor, fill: Callable[[], T]) -> T: ...
    def timing_pair(self) -> tuple[Any, Any] | None: ...


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
            return page_aligned_empty(nbytes)  # disk reads land here directly
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def empty_host(self, nbytes: int, pinned: bool) -> torch.Tensor:
        return page_aligned_empty(nbytes)

    def release_host(self, buf: torch.Tensor) -> None:
        pass

    def host_fill(self, dst: torch.Tensor, fill: Callable[[], T]) -> T:
        """The host (a reader thread) writes ``dst``; the test backend reports it."""
        return fill()

    def timing_pair(self) -> None:
        return None


class StreamBackend:
    """CUDA (ROCm reports "cuda" too) and XPU: a side copy stream and real events."""

    synchronous = False

    def __init__(self, device: torch.device) -> None:
        if device.index is None:
            device = torch.device(device.type, torch.accelerator.current_device_index())
        self.device = device
        self.can_pin = True
        self._copy_stream: torch.Stream | None = None

    def compute_stream(self) -> torch.Stream:
        # Looked up at call time: the caller may run the model under its own stream (seed 004).
        return torch.accelerator.current_stream(self.device)

    def copy_stream(self) -> torch.Stream:
        if self._copy_stream is None:
            if self.device.type == "cuda":
                self._copy_stream = torch.cuda.Stream(self.device)  # for torch.cuda.stream()
            else:
                self._copy_stream = torch.Stream(device=self.device)
        return self._copy_stream

    def use_stream(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        if self.device.type == "cuda":
            return torch.cuda.stream(stream)
        return _stream_context(stream)

    def record(self, stream: Any) -> torch.Event:
        return stream.record_event()

    def wait(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def host_wait(self, event: Any) -> None:
        event.synchronize()

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=True)

    def empty_device(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def empty_host(self, nbytes: int, pinned: bool) -> torch.Tensor:
        buf = page_aligned_empty(nbytes)
        if pinned and nbytes:
            if self.device.type == "cuda":
                # Register the exact allocation: the caching host allocator would round a
                # pinned slab up to the next power of two (facts.md), up to 2x the RAM.
                err = torch.cuda.cudart().cudaHostRegister(buf.data_ptr(), nbytes, 0)
                code = int(getattr(err, "value", err))
                if code != 0:
                    raise RuntimeError(
                        f"pinning {nbytes} bytes failed (CUDA error {code}); "
                        "set tier to 'ram' where pinned memory is capped"
                    )
            else:
                buf = buf.pin_memory()
        return buf

    def release_host(self, buf: torch.Tensor) -> None:
        if self.device.type == "cuda" and buf.numel() and buf.is_pinned():
            torch.cuda.cudart().cudaHostUnregister(buf.data_ptr())

    def host_fill(self, dst: torch.Tensor, fill: Callable[[], T]) -> T:
        """The host (a reader thread) writes ``dst``; the test backend reports it."""
        return fill()

    def timing_pair(self) -> tuple[torch.Event, torch.Event]:
        return torch.Event(self.device, enable_timing=True), torch.Event(
            self.device, enable_timing=True
        )


@contextlib.contextmanager
def _stream_context(stream: Any) -> Iterator[None]:
    prev = torch.accelerator.current_stream(stream.device)
    torch.accelerator.set_stream(stream)
    try:
        yield
    finally:
        torch.accelerator.set_stream(prev)


def backend_for(device: torch.device) -> Backend:
    if device.type in ("cuda", "xpu"):
        return StreamBackend(device)
    if device.type in ("cpu", "mps"):
        return SyncBackend(device)
    raise ValueError(f"onload_device {device} is not supported; use cuda, xpu, mps or cpu")
