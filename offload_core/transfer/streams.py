"""The CUDA (ROCm reports "cuda" too) and XPU backend: a side copy stream and real events.

[Note: one family of events]
Every event Ferry records or waits on is a generic ``torch.Event``, recorded with
``event.record(stream)`` and waited on with ``event.wait(stream)``; no ``stream.record_event()``
or ``stream.wait_event(event)`` on the hot path. PyTorch has two families that mix silently:
``torch.cuda.Stream.record_event()`` returns a ``torch.cuda.Event``, whose recorded CUDA event
lives in a field of its own (``THCPEvent::cuda_event``), while the generic
``torch.Stream.wait_event(e)`` (what ``torch.accelerator.current_stream()`` returns: the compute
stream) waits on the base ``THPEvent::event``, which a ``torch.cuda.Event`` never records, so
the wait is a no-op (torch/csrc/Stream.cpp, ``THPStream_wait_event``). That was Ferry's wait 1
until the first GPU run (an H200): the compute stream never waited for a copy, and a copy
slower than the compute (a large group from pinned RAM or the disk; tests/test_gpu.py's slowed
copies) gave wrong output, while plain RAM hid it (a copy from pageable memory returns when its
bytes are staged). A generic event takes either family's stream: both keep the stream's id,
device and type in the base ``THPStream`` that ``Event.record`` and ``Event.wait`` read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from ..disk.host_memory import host_buffer
from .pinned import PinnedHost

T = TypeVar("T")


class StreamBackend:
    """CUDA (ROCm reports "cuda" too) and XPU: a side copy stream and real events."""

    synchronous = False

    def __init__(self, device: torch.device) -> None:
        if device.index is None:
            device = torch.device(device.type, torch.accelerator.current_device_index())
        self.device = device
        self.can_pin = True
        self.pinned = PinnedHost()  # [Note: pinned memory is unregistered before it is unmapped]
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
        # [Note: one family of events]
        event = torch.Event(self.device)
        event.record(stream)
        return event

    def wait(self, stream: Any, event: Any) -> None:
        event.wait(stream)  # [Note: one family of events]

    def host_wait(self, event: Any) -> None:
        event.synchronize()

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=True)

    def empty_device(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def empty_host(self, nbytes: int, pinned: bool) -> torch.Tensor:
        if not (pinned and nbytes):
            return host_buffer(nbytes)
        if self.device.type == "cuda":
            # Registered exactly: the caching host allocator would round a pinned slab up to
            # the next power of two, up to 2x the RAM.
            return self.pinned.buffer(nbytes)
        return host_buffer(nbytes).pin_memory()

    def release_host(self, buf: torch.Tensor) -> None:
        if self.device.type == "cuda":
            self.pinned.release(buf)

    def register_host(self, buf: torch.Tensor) -> bool:
        # XPU has no registration of foreign memory in torch: its copies stage.
        return self.device.type == "cuda" and self.pinned.register(buf)

    def unregister_host(self, buf: torch.Tensor) -> None:
        if self.device.type == "cuda":
            self.pinned.unregister(buf)

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
