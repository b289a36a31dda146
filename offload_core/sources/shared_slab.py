"""The shared RAM tier's source: a group's slab as a segment every Ferry process of this user
maps (disk/shared_segments.py: [Note: one copy across processes]), read-only. Its copies to
the device are the pinned tier's (``Transfers.copy_slab``) from the view this process
registered for pinned copies, or the RAM tier's through the staging ring where it could not
register it (a CPU, XPU, a driver without read-only registration); there is no copy code here.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import torch

from ..disk.shared_segments import Held, SharedNamespace

if TYPE_CHECKING:
    from ..transfer.backend import Backend
    from ..transfer.buffers import Slot
    from ..transfer.copies import Transfers


class SharedSlabSource:
    uses_slot = True
    file_plan = None  # its bytes are in memory: no file Ferry checks or repairs

    def __init__(self, held: Held, namespace: SharedNamespace, pinned: bool) -> None:
        self.held = held
        self.namespace = namespace
        self.pinned = pinned  # the view is registered with the device (pinned copies)

    @property
    def slab(self) -> torch.Tensor:
        return self.held.data

    def load(self, transfers: Transfers, slot: Slot | None) -> Future[Any]:
        assert slot is not None
        return transfers.copy_slab(slot, self.slab, self.slab.numel(), self.pinned)

    def release(self) -> None:
        pass

    def discard(self) -> None:
        pass

    def host_bytes(self, nbytes: int) -> torch.Tensor:
        return self.slab

    def close(self, backend: Backend) -> None:
        # [Note: pinned memory is unregistered before it is unmapped] (transfer/pinned.py)
        if self.pinned:
            backend.unregister_host(self.slab)
            self.pinned = False
        self.namespace.release(self.held)


def shared_note(sources: list[SharedSlabSource], can_pin: bool) -> str | None:
    """The layout's sentence about its shared groups: how many another process had made (and
    with how many processes they are shared), how many this one made, and whether they are
    pinned."""
    if not sources:
        return None
    mapped = [s for s in sources if not s.held.made]
    made_bytes = sum(s.slab.numel() for s in sources if s.held.made)
    mapped_bytes = sum(s.slab.numel() for s in mapped)
    others = max((s.held.others for s in sources), default=0)
    from ..units import fmt_bytes

    who = f"shared with {others} other process{'es' if others != 1 else ''}"
    pinned = sum(s.pinned for s in sources)
    how = (
        "copied from the segments into the slots (a CPU pins nothing)"
        if not can_pin
        else "registered for pinned copies"
        if pinned == len(sources)
        else f"{pinned} of {len(sources)} registered for pinned copies; the rest through the "
        "staging ring"
    )
    return (
        f"shared tier: {len(sources)} groups, {who}: {fmt_bytes(mapped_bytes)} mapped from "
        f"segments another process made, {fmt_bytes(made_bytes)} made here; {how}"
    )
