"""The copies into device slots, and the three waits that make them safe.

[Note: the three waits]
A device slot (a region of the ring, [Note: the schedule]) is written by the copy stream and
read by the compute stream; a pinned staging buffer is written by the host (a reader thread)
and read by the copy stream. Three waits keep that safe, all issued in this file, and nothing
else on the hot path blocks:
  1. ``wait_ready``: compute waits on the load's ready-event before a group's forward reads
     the slot;
  2. ``_copy``: the copy stream waits on the compute-done event of every released region the
     slot overlaps (``_released``: for each byte of the ring, the event of the last group
     that computed from it) before it overwrites the slot. A region released later over the
     same bytes replaces the older event there: its copy waited on that event and its
     compute on its copy, so waiting on the newer one orders after both. The schedule never
     overlaps a region not released yet, so the events are known when the load is issued;
  3. ``_staged``: the host waits on the last copy out of a staging buffer
     (``Staging.free``) before it refills it. A reader thread takes a staging buffer from a
     queue when it starts and gives it back once its copy is issued, with that copy's event.
     The staging ring is filled by one path for two kinds of host bytes: a disk read
     (``read_file``) and a slab in pageable RAM (``copy_slab`` of an unpinned slab: the
     reader's threads copy it into the pinned buffer, [Note: the RAM tier through staging]),
     so wait 3 is the same wait for both.
Each event is recorded on the stream that did the work, and the consumer's stream is looked
up when the wait is issued, never cached (the caller may run the model under its own stream).
A load's ready-event always travels as a ``Future`` beside its slot (``runtime.engine.Load``):
resolved at once for a copy from a pinned slab, by the reader's load thread for a disk read
or a staged slab (disk/reader.py: the one reader, which owns the threads and how a file is
read).
On a CPU (``backend.synchronous``) there are no events: the load thread fills the slot itself,
which is safe because the last reader of the region's bytes returned before the load was
issued.

[Note: the RAM tier through staging]
A copy from pageable memory to a device is staged by the driver through its own small pinned
buffers, one thread, one chunk at a time: the first GPU run measured 8.5 GB/s from the RAM
tier against 55.5 GB/s from pinned memory (docs/benchmarks.md, "The first GPU run"). So a
group whose slab is not pinned (the RAM tier; the pinned tier's groups past the pin limit)
goes the disk tier's way: the load thread takes a pinned staging buffer (wait 3), the
reader's pool copies the slab into it in pieces in parallel (``Reader.copy_in``), and the
copy stream copies the staging buffer into the slot as from any pinned slab. Only the
staging ring is pinned (prefetch_depth + 1 buffers of the largest group). A pinned slab, a
backend that cannot pin (MPS) and a CPU (no device copy: the slab is copied into the slot
as before) keep the direct copy.
"""

from __future__ import annotations

import functools
import logging
import queue
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

import torch

from ..disk.plan import ReadPlan
from ..disk.reader import ReadClock, Reader
from .backend import Backend
from .buffers import Slot, Staging
from .timings import DeviceTimings

log = logging.getLogger("ferry")


class Tally(ReadClock, Protocol):
    """Where the copies count (runtime/stats.py: Counters)."""

    def add(self, **kw: float) -> None: ...


def resolved(value: Any) -> Future[Any]:
    done: Future[Any] = Future()
    done.set_result(value)
    return done


class Transfers:
    """The copy side of one offload: its ring of slots, the events over it, the staging
    buffers and the copies; disk reads go through its ``reader``."""

    def __init__(
        self,
        backend: Backend,
        counters: Tally,
        ring_bytes: int,
        staging: tuple[int, int] | None = None,
        read_threads: int = 4,
    ) -> None:
        """``ring_bytes`` (0: no slots, every group computes in place); ``staging``: how
        many staging buffers of how many bytes (the largest group) a disk read or an unpinned
        slab goes through, None for none; ``read_threads``: the reader's pool (checked
        chunks, the pieces of a slab copied into staging)."""
        self.backend = backend
        self.counters = counters
        self.reader = Reader(counters, read_threads)
        self.ring = backend.empty_device(ring_bytes) if ring_bytes else None
        #: (start, end, compute-done event) of the released regions, disjoint (wait 2).
        self._released: list[tuple[int, int, Any]] = []
        self.stagings: list[Staging] = []
        self._free_stagings: queue.SimpleQueue[Staging] = queue.SimpleQueue()
        if staging is not None and self.ring is not None and not backend.synchronous:
            count, nbytes = staging
            self.stagings = [Staging(self._staging_buffer(nbytes)) for _ in range(count)]
        for st in self.stagings:
            self._free_stagings.put(st)
        self.timings = DeviceTimings(counters)

    def _staging_buffer(self, nbytes: int) -> torch.Tensor:
        """Pinned where the backend pins and the system still agrees (a pinned tier may
        have pinned up to its cap), else plain: slower copies, the same waits."""
        b = self.backend
        if b.can_pin:
            try:
                return b.empty_host(nbytes, pinned=True)
            except RuntimeError as e:
                log.warning("ferry: a staging buffer could not be pinned (%s); using RAM", e)
        return b.empty_host(nbytes, pinned=False)

    def slot_at(self, offset: int, size: int) -> Slot:
        """The region ``offset .. offset + size`` of the ring, as a slot."""
        assert self.ring is not None and offset + size <= self.ring.numel()
        return Slot(offset, self.ring[offset : offset + size])

    def _overlapped(self, slot: Slot) -> list[Any]:
        """The compute-done events a copy into ``slot`` waits on (wait 2)."""
        start, end = slot.offset, slot.offset + slot.buf.numel()
        return [ev for a, b, ev in self._released if a < end and start < b]

    # -- loads: each returns the future of the slot's ready-event --------------------------
    @property
    def stages_memory(self) -> bool:
        """Whether an unpinned slab goes through the staging ring ([Note: the RAM tier
        through staging])."""
        return bool(self.stagings) and self.backend.can_pin

    def copy_slab(
        self, slot: Slot, slab: torch.Tensor, nbytes: int, pinned: bool = True
    ) -> Future[Any]:
        """A host slab into ``slot``: straight from a pinned one, through a staging buffer
        from pageable RAM ([Note: the RAM tier through staging])."""
        slot_frees = self._overlapped(slot)  # on the engine's thread (wait 2)
        if pinned or not self.stages_memory:
            return resolved(self._copy(slot, slab, nbytes, slot_frees))
        fill = functools.partial(self.reader.copy_in, slab, nbytes=nbytes)
        return self.reader.submit(self._staged, fill, nbytes, slot, slot_frees)

    def read_file(self, plan: ReadPlan, slot: Slot) -> Future[Any]:
        """A group's bytes from a file into ``slot``: straight in on a CPU, else through a
        staging buffer."""
        if self.backend.synchronous:
            buf = slot.buf
            return self.reader.submit(
                self.backend.host_fill, buf, lambda: self.reader.read(plan, buf)
            )
        # Looked up here, on the engine's thread: see [Note: the three waits] (wait 2).
        slot_frees = self._overlapped(slot)
        fill = functools.partial(self.reader.read, plan)
        return self.reader.submit(self._staged, fill, plan.span, slot, slot_frees)

    def run_read(self, nbytes: int, read: Callable[[], None]) -> Future[Any]:
        """A read that needs no slot (a mapped group faulting its pages in); no event."""
        return self.reader.submit(self.reader.timed, nbytes, read)

    def wait_ready(self, ready: Future[Any]) -> None:
        """Wait 1: the compute stream waits for the load; the host waits only for a reader
        thread that has not yet issued the copy."""
        t0 = time.perf_counter()
        event = ready.result()
        waited = time.perf_counter() - t0
        if event is not None:
            b = self.backend
            compute = b.compute_stream()
            pair = b.timing_pair()
            if pair is not None:
                pair[0].record(compute)
            b.wait(compute, event)
            if pair is not None:
                pair[1].record(compute)
                self.timings.timed("stall", pair)
        self.counters.add(stall_s=waited, group_loads=1)

    def slot_done(self, slot: Slot) -> None:
        """The group computing from ``slot`` is done with it (as far as the host issues):
        its compute-done event replaces the older ones over the same bytes."""
        event = self.backend.record(self.backend.compute_stream())
        if event is None:
            return  # a CPU: the group's last reader has returned
        start, end = slot.offset, slot.offset + slot.buf.numel()
        kept = []
        for a, b, ev in self._released:
            if b <= start or end <= a:
                kept.append((a, b, ev))
                continue
            if a < start:
                kept.append((a, start, ev))
            if end < b:
                kept.append((end, b, ev))
        kept.append((start, end, event))
        self._released = kept

    # -- the work ---------------------------------------------------------------------------
    def _copy(self, slot: Slot, src: torch.Tensor, nbytes: int, slot_frees: list[Any]) -> Any:
        b = self.backend
        stream = b.copy_stream()
        with b.use_stream(stream):
            for free in slot_frees:
                b.wait(stream, free)  # wait 2: the last readers of the region's bytes are done
            pair = b.timing_pair()
            t0 = time.perf_counter()
            if pair is not None:
                pair[0].record(stream)
            b.copy(slot.buf[:nbytes], src[:nbytes])
            ready = b.record(stream)
            if pair is not None:
                pair[1].record(stream)
                self.timings.timed("h2d", pair)
                self.counters.add(bytes_h2d=nbytes)
            else:
                spent = time.perf_counter() - t0
                self.counters.add(bytes_h2d=nbytes, h2d_s=spent)
                if b.synchronous:
                    self.counters.add(stall_s=spent)  # a CPU copy blocks compute: stall
        return ready

    def _staged(
        self,
        fill: Callable[[torch.Tensor], None],
        nbytes: int,
        slot: Slot,
        slot_frees: list[Any],
    ) -> Any:
        """On the load thread: ``fill`` (a disk read, a copy from a RAM slab) writes a
        staging buffer, whose first ``nbytes`` the copy stream then copies into ``slot``."""
        staging = self._free_stagings.get()  # given back below, by whoever holds it
        try:
            if staging.free is not None:
                self.backend.host_wait(staging.free)  # wait 3: the last copy out of it is done
            self.backend.host_fill(staging.buf, lambda: fill(staging.buf))
            ready = self._copy(slot, staging.buf, nbytes, slot_frees)
            staging.free = ready  # the buffer travels with its event
            return ready
        finally:
            self._free_stagings.put(staging)

    # -- device timings -----------------------------------------------------------------------
    def resolve_timings(self) -> None:
        """Adds the device-timed intervals that have finished to the counters."""
        self.timings.resolve()

    def flush_timings(self) -> None:
        b = self.backend
        self.timings.flush(lambda: b.host_wait(b.record(b.compute_stream())))

    def settle(self) -> None:
        """The host waits until every copy issued so far is done: a dropped prefetch's copy
        may still be reading a host slab or a staging buffer that is released next."""
        b = self.backend
        if not b.synchronous and (self.ring is not None or self.stagings):
            b.host_wait(b.record(b.copy_stream()))

    def close(self) -> None:
        """After the engine is quiet: the reader's threads joined, buffers released."""
        self.reader.close()
        self.ring = None
        self._released.clear()
        for s in self.stagings:
            self.backend.release_host(s.buf)
        self.stagings.clear()
