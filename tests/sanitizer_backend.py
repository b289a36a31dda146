"""A faithful stand-in for CUDA streams on a CPU machine, judged by PyTorch's own sanitizer.

Memory is real (CPU tensors, real copies, real reads from disk); streams and events are fakes
whose every record / wait / synchronize, and every kernel that touches a slot, a staging
buffer or a slab, is fed to ``torch.cuda._sanitizer.EventHandler``: the happens-before engine
behind TORCH_CUDA_SANITIZER=1 (torch/cuda/_sanitizer.py). The host is a pseudo-stream: a reader thread filling
a staging buffer is a kernel on it; ``host_wait(event)`` is an event synchronization.

``drop`` removes one of the engine's three waits so a test can show the checker has teeth:
  "compute-waits-copy", "copy-waits-compute", "host-waits-copy".
``slow`` slows one side down by ``delay`` seconds a call, so the real threads' timing changes
under the same schedule: "copy" (every copy on the copy stream), "host" (every host fill of a
buffer, on a reader thread).
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
from torch.cuda._sanitizer import EventHandler
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten

from offload_core.units import PAGE

T = TypeVar("T")
Range = tuple[int, int]  # (address, nbytes)
_ids = itertools.count(1000)


class FakeStream:
    def __init__(self, name: str) -> None:
        self.id = next(_ids)
        self.name = name

    def record_event(self, event: Any = None) -> Any:  # only timing uses it; none here
        raise AssertionError("timing events are not used with this backend")

    def __repr__(self) -> str:
        return f"<stream {self.name}>"


class FakeEvent:
    def __init__(self, stream: FakeStream) -> None:
        self.id = next(_ids)
        self.stream = stream


class SanitizerBackend:
    synchronous = False
    can_pin = True

    def __init__(
        self, drop: str | None = None, slow: str | None = None, delay: float = 0.005
    ) -> None:
        assert drop in (None, "compute-waits-copy", "copy-waits-compute", "host-waits-copy")
        assert slow in (None, "copy", "host")
        self.drop = drop
        self.slow = slow
        self.delay = delay
        self.device = torch.device("cpu")
        self.handler = EventHandler()
        self.lock = threading.RLock()
        self.errors: list[Any] = []
        self.compute = FakeStream("compute")
        self.copier = FakeStream("copy")
        self.host = FakeStream("host")
        for s in (self.compute, self.copier, self.host):
            self.handler._handle_stream_creation(s.id)
        self._tls = threading.local()
        self._starts: list[int] = []  # sorted starts of the tracked buffers
        self._ends: dict[int, int] = {}
        #: How finely each buffer is tracked: the device ring by page (its slots are page-
        #: aligned regions of it), anything else whole.
        self._grains: dict[int, int] = {}
        self.registered_views = 0  # shared segments' views pinned now (register_host)
        self.waits = {"compute-waits-copy": 0, "copy-waits-compute": 0, "host-waits-copy": 0}

    # -- streams -----------------------------------------------------------------------------
    def current(self) -> FakeStream:
        return getattr(self._tls, "stream", self.compute)

    def compute_stream(self) -> FakeStream:
        return self.current()

    def copy_stream(self) -> FakeStream:
        return self.copier

    @contextlib.contextmanager
    def use_stream(self, stream: FakeStream) -> Iterator[None]:
        prev = self.current()
        self._tls.stream = stream
        try:
            yield
        finally:
            self._tls.stream = prev

    def record(self, stream: FakeStream) -> FakeEvent:
        ev = FakeEvent(stream)
        with self.lock:
            self.handler._handle_event_creation(ev.id)
            self.handler._handle_event_record(ev.id, stream.id)
        return ev

    def wait(self, stream: FakeStream, event: FakeEvent) -> None:
        kind = None
        if stream is self.compute and event.stream is self.copier:
            kind = "compute-waits-copy"
        elif stream is self.copier and event.stream is self.compute:
            kind = "copy-waits-compute"
        if kind is not None:
            self.waits[kind] += 1
        if kind is not None and kind == self.drop:
            return
        with self.lock:
            self.handler._handle_event_wait(event.id, stream.id)

    def host_wait(self, event: FakeEvent) -> None:
        self.waits["host-waits-copy"] += 1
        if self.drop == "host-waits-copy":
            return
        with self.lock:
            self.handler._handle_event_synchronization(event.id)

    # -- memory --------------------------------------------------------------------------------
    def _track(self, t: torch.Tensor, grain: int | None = None) -> torch.Tensor:
        if t.numel():
            start = t.data_ptr()
            with self.lock:
                bisect.insort(self._starts, start)
                self._ends[start] = start + t.numel()
                self._grains[start] = grain or t.numel()
        return t

    def base_of(self, ptr: int) -> int | None:
        """The tracked buffer holding address ``ptr`` (the ring, stagings, slabs), if any."""
        i = bisect.bisect_right(self._starts, ptr) - 1
        if i >= 0 and ptr < self._ends[self._starts[i]]:
            return self._starts[i]
        return None

    def cells(self, ptr: int, nbytes: int) -> list[int]:
        """The tracked cells (a page of the ring, or a whole buffer) that bytes ``ptr ..
        ptr + nbytes`` touch: what the sanitizer sees as separate memory."""
        base = self.base_of(ptr)
        if base is None:
            return []
        grain = self._grains[base]
        first = base + (ptr - base) // grain * grain
        end = min(ptr + max(nbytes, 1), self._ends[base])
        return list(range(first, end, grain))

    def empty_device(self, nbytes: int) -> torch.Tensor:
        return self._track(torch.empty(nbytes, dtype=torch.uint8), grain=PAGE)

    def empty_host(self, nbytes: int, pinned: bool) -> torch.Tensor:
        return self._track(torch.empty(nbytes, dtype=torch.uint8))

    def register_host(self, buf: torch.Tensor) -> bool:
        """A shared segment's view pinned: tracked like a pinned slab from here."""
        self.registered_views += 1
        self._track(buf)
        return True

    def unregister_host(self, buf: torch.Tensor) -> None:
        # Unpinned, then unmapped: a copy still reading it races with this, as with a release.
        self.registered_views -= 1
        self.release_host(buf)

    def release_host(self, buf: torch.Tensor) -> None:
        # The memory goes back (to the OS, or unpinned): from here anyone may write it, so a
        # release is a host write, and a copy still reading the buffer races with it.
        if buf.numel():
            self.kernel(self.host, set(), {_span(buf)}, "release")
        # Its memory may come back in another allocation: no longer this buffer's cells.
        start = buf.data_ptr()
        with self.lock:
            if start in self._ends and buf.numel():
                self._starts.remove(start)
                del self._ends[start], self._grains[start]

    # -- work ----------------------------------------------------------------------------------
    def kernel(self, stream: FakeStream, read: set[Range], written: set[Range], op: str) -> None:
        """A kernel on ``stream`` that reads and writes these byte ranges (ptr, nbytes)."""
        reads = {c for r in read for c in self.cells(*r)}
        writes = {c for r in written for c in self.cells(*r)}
        if not reads and not writes:
            return
        with self.lock:
            aliases = {p: [op] for p in reads | writes}
            errs = self.handler._handle_kernel_launch(
                stream.id, reads - writes, writes, set(), op, aliases
            )
            self.errors.extend(errs)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        if self.slow == "copy" and self.current() is self.copier:
            time.sleep(self.delay)
        self._tls.in_copy = True
        try:
            dst.copy_(src)
        finally:
            self._tls.in_copy = False
        self.kernel(self.current(), {_span(src)}, {_span(dst)}, "copy")

    def host_fill(self, dst: torch.Tensor, fill: Callable[[], T]) -> T:
        self.kernel(self.host, set(), {_span(dst)}, "host-read-into")
        if self.slow == "host":
            time.sleep(self.delay)
        out = fill()
        # The host finished writing before it launches anything that follows.
        with self.lock:
            self.handler._handle_stream_synchronization(self.host.id)
        return out

    def timing_pair(self) -> None:
        return None

    def in_copy(self) -> bool:
        return getattr(self._tls, "in_copy", False)


def _span(t: torch.Tensor) -> Range:
    """The bytes a (possibly strided) tensor's elements lie in: (first address, length)."""
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    return t.data_ptr(), (last + 1) * t.element_size()


def _ptrs(value: Any) -> list[Range]:
    out = []
    for leaf in tree_flatten(value)[0]:
        if isinstance(leaf, torch.Tensor):
            if is_traceable_wrapper_subclass(leaf):
                names, _ = leaf.__tensor_flatten__()  # type: ignore[attr-defined]
                out += [_span(getattr(leaf, n)) for n in names if getattr(leaf, n).numel()]
            elif leaf.numel():
                out.append(_span(leaf))
    return out


class ComputeKernels(TorchDispatchMode):
    """Reports every aten op the model runs as a kernel on the backend's current stream,
    with the read/write rules of CSAN's ArgumentHandler (views and factories touch no data)."""

    def __init__(self, backend: SanitizerBackend) -> None:
        super().__init__()
        self.backend = backend

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.backend.in_copy():
            return out
        schema = func._schema
        reads: set[Range] = set()
        writes: set[Range] = set()
        positional = list(zip(schema.arguments, args))
        named = [(a, kwargs[a.name]) for a in schema.arguments if a.name in kwargs]
        for arg, value in positional + named:
            info = arg.alias_info
            if info is not None and info.is_write:
                writes.update(_ptrs(value))
            elif info is None:
                reads.update(_ptrs(value))
        for ret in schema.returns:
            if ret.alias_info is None or ret.alias_info.is_write:
                writes.update(_ptrs(out))
        self.backend.kernel(self.backend.current(), reads, writes, str(func))
        return out
