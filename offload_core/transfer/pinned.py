"""Host memory pinned with ``cudaHostRegister``: registered exactly (no rounding up), and
unregistered before it is unmapped, whichever way it goes.

[Note: pinned memory is unregistered before it is unmapped]
``cudaHostRegister`` pins the physical pages behind a range of virtual addresses, and the
driver keeps that range registered until ``cudaHostUnregister`` names the same pointer. Memory
freed while still registered leaves the range registered: the next buffer the process maps at
those addresses is then taken for pinned memory by the driver, and a copy from it reads the
old, pinned pages (wrong bytes, silently) or fails with ``invalid argument`` where it runs past
the stale range's end. So:
- the memory is an anonymous mapping of ``PinnedMapping``, whose ``__del__`` unregisters before
  the mapping is unmapped: a buffer dropped without ``release_host`` is unregistered too;
- ``release_host`` unregisters by the pointer that was registered (kept here), never by
  ``Tensor.is_pinned()``: that asks about the storage's first byte, and a page-aligned view
  of a larger allocation starts after it, so it answered False for memory that was
  registered (the buffers were such views until the first GPU run).
- each buffer's storage starts at the registered pointer (disk/host_memory.py), so
  ``is_pinned()`` is True for it and every view of it: ComfyUI's ``pin_memory`` checks that
  before it registers a weight itself, since registering a range twice fails and "queues an
  error on the GPU async" (its comment, v0.33) that a later, unrelated call then reports.
Unregistering waits for nothing: whoever releases a buffer has waited for its last copy.
"""

from __future__ import annotations

import mmap
import weakref

import torch

from ..disk.host_memory import host_buffer

#: cudaHostRegisterReadOnly (driver_types.h): the range is only read by the device.
HOST_REGISTER_READ_ONLY = 0x08


class PinnedMapping(mmap.mmap):
    """An anonymous private mapping that unregisters its pinned range when it goes."""

    registered_at = 0  # the pointer given to cudaHostRegister, 0 while none is registered

    def unregister(self) -> None:
        ptr, self.registered_at = self.registered_at, 0
        if ptr:
            _check(torch.cuda.cudart().cudaHostUnregister(ptr), "unregistering pinned memory")

    def __del__(self) -> None:
        try:
            self.unregister()
        except Exception:  # at interpreter exit CUDA may already be gone
            pass


class PinnedHost:
    """Makes and releases a backend's registered host buffers (one per backend)."""

    def __init__(self) -> None:
        self._by_pointer: weakref.WeakValueDictionary[int, PinnedMapping] = (
            weakref.WeakValueDictionary()
        )
        self._foreign: set[int] = set()  # pointers ``register`` pinned

    def buffer(self, nbytes: int) -> torch.Tensor:
        made: list[PinnedMapping] = []

        def mapping(length: int) -> PinnedMapping:
            made.append(PinnedMapping(-1, length, flags=mmap.MAP_PRIVATE))
            return made[-1]

        buf = host_buffer(nbytes, mapping)
        ptr = buf.data_ptr()
        err = torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 0)
        if _code(err):
            raise RuntimeError(
                f"pinning {nbytes} bytes failed (CUDA error {_code(err)}); "
                "set tier to 'ram' where pinned memory is capped"
            )
        made[0].registered_at = ptr
        self._by_pointer[ptr] = made[0]
        return buf

    def release(self, buf: torch.Tensor) -> None:
        """Unregisters ``buf`` now if this made it (a later drop of its memory is then free)."""
        mapping = self._by_pointer.pop(buf.data_ptr(), None)
        if mapping is not None:
            mapping.unregister()

    def register(self, buf: torch.Tensor) -> bool:
        """Pins ``buf``, memory mapped by someone else (a shared segment, read-only: the
        read-only flag, which the driver needs for a mapping without write access); False
        where the driver refuses (an old driver, a platform without read-only registration:
        the copies then stage). The owner unregisters before it unmaps (``unregister``)."""
        if not buf.numel():
            return False
        ptr, nbytes = buf.data_ptr(), buf.numel() * buf.element_size()
        if _code(torch.cuda.cudart().cudaHostRegister(ptr, nbytes, HOST_REGISTER_READ_ONLY)):
            return False
        self._foreign.add(ptr)
        return True

    def unregister(self, buf: torch.Tensor) -> None:
        ptr = buf.data_ptr()
        if ptr in self._foreign:
            self._foreign.discard(ptr)
            _check(torch.cuda.cudart().cudaHostUnregister(ptr), "unregistering shared memory")

    def registered(self) -> int:
        """How many buffers are registered now (for tests)."""
        return sum(1 for m in self._by_pointer.values() if m.registered_at)


def _code(err: object) -> int:
    return int(getattr(err, "value", err))  # type: ignore[call-overload]


def _check(err: object, what: str) -> None:
    if _code(err):
        raise RuntimeError(f"{what} failed (CUDA error {_code(err)})")
