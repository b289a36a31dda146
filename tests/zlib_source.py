"""A weight source the tests add the way any new kind is added (sources/kinds.py): one file,
this one, and one registration (``kinds.registered("zlib", zlib_kind)``).

Each RAM-tier group's slab is kept zlib-compressed in RAM; a load inflates it into one of two
host buffers the groups share and copies that into the group's slot on the copy stream. A
buffer travels with the event of the last copy out of it, and the host waits on that event
before it inflates into it again (as staging does: [Note: the three waits], wait 3). While a
group does not compute, its tensors are views of one buffer of zeros all groups share (the
tests run the model and never read its weights between forwards).
"""

from __future__ import annotations

import zlib
from concurrent.futures import Future
from typing import Any

import torch

from offload_core.formats.safetensors import byte_view
from offload_core.policy import RamTier
from offload_core.sources.kinds import Made, Placed, Placing
from offload_core.transfer.backend import Backend
from offload_core.transfer.buffers import Slot
from offload_core.transfer.copies import Transfers


class Inflater:
    """Two host buffers of the largest group's size, each beside its last copy's event."""

    def __init__(self) -> None:
        self.nbytes = 0  # the largest group's, known before the first load
        self.buffers: list[list[Any]] = []  # [buffer, event of the last copy out of it]
        self.turn = 0

    def inflate(self, backend: Backend, blob: bytes, nbytes: int) -> torch.Tensor:
        if not self.buffers:
            self.buffers = [[backend.empty_host(self.nbytes, pinned=False), None] for _ in "ab"]
        self.turn ^= 1
        buf, free = self.buffers[self.turn]
        if free is not None:
            backend.host_wait(free)  # the last copy out of it is done: it may be refilled

        def fill() -> None:
            byte_view(buf)[:nbytes] = zlib.decompress(blob)

        backend.host_fill(buf[:nbytes], fill)
        return buf  # type: ignore[no-any-return]

    def copied(self, buf: torch.Tensor, event: Any) -> None:
        self.buffers[self.turn][1] = event


class ZlibSource:
    uses_slot = True
    file_plan = None  # its bytes are in memory: no file

    def __init__(self, packed: torch.Tensor, inflater: Inflater) -> None:
        self.nbytes = packed.numel()
        self.blob = zlib.compress(byte_view(packed), 1)
        self.inflater = inflater
        inflater.nbytes = max(inflater.nbytes, self.nbytes)

    def load(self, transfers: Transfers, slot: Slot | None) -> Future[Any]:
        assert slot is not None
        buf = self.inflater.inflate(transfers.backend, self.blob, self.nbytes)
        ready = transfers.copy_slab(slot, buf, self.nbytes)
        self.inflater.copied(buf, ready.result())
        return ready

    def release(self) -> None:
        pass

    def discard(self) -> None:
        pass

    def host_bytes(self, nbytes: int) -> torch.Tensor:
        buf = torch.empty(self.nbytes, dtype=torch.uint8)
        byte_view(buf)[:] = zlib.decompress(self.blob)
        return buf

    def close(self, backend: Backend) -> None:
        self.blob = b""


_zeros: list[torch.Tensor] = [torch.zeros(0, dtype=torch.uint8)]
_inflaters: dict[int, Inflater] = {}  # by placement: its groups share two buffers


def zlib_kind(p: Placing, g: Placed) -> Made | None:
    """Every group of a RAM-tier offload, compressed."""
    if not isinstance(p.tier, RamTier):
        return None
    if _zeros[0].numel() < g.spec.nbytes:
        _zeros[0] = torch.zeros(g.spec.nbytes, dtype=torch.uint8)
    inflater = _inflaters.setdefault(id(p), Inflater())
    source = ZlibSource(g.packed, inflater)
    p.backend.release_host(g.packed)  # compressed: the slab the placement packed is let go
    return source, [e.build(_zeros[0]) for e in g.spec.entries]
