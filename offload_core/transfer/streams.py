"""The CUDA (ROCm reports "cuda" too) and XPU backend: a side copy stream and real events."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from ..disk.host_memory import host_buffer

T = TypeVar("T")


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
        # Looked up at call time, never cached: the caller may run the model under a stream of
        # its own, and a cached stream would order Ferry's waits against the wrong one.
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
        buf = host_buffer(nbytes)
        if pinned and nbytes:
            if self.device.type == "cuda":
                # Register the exact allocation: the caching host allocator would round a
                # pinned slab up to the next power of two, up to 2x the RAM.
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
