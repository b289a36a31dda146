"""The kinds of weight source, in the order a streamed group is offered to them: the one place
that knows them. Each kind is a function that makes the group's source (and the forms its
tensors take while it does not compute) or declines; the first that makes one wins.

    host_slab    the RAM tiers: the group's own slab, pinned or plain (host_slab.py)
    shared_ram   the shared RAM tier: a segment every Ferry process maps (shared_slab.py)
    checkpoint   the disk tier, where the user's checkpoint holds the group's bytes as they
                 are (disk/file_source.py reads it; nothing written)
    group_file   the disk tier otherwise: Ferry's group file (disk/store.py), read into a
                 slot (disk/file_source.py) or, on a CPU, computed from in place
                 (disk/mapped.py)

Adding a kind is one file (its source, implementing runtime/source.py's ``WeightSource``,
and its kind function) plus one line in ``KINDS`` (or a ``registered`` block, as the tests'
own kind does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import torch

from ..disk.file_source import FileSource
from ..disk.plan import ReadPlan
from ..disk.shared_segments import namespace
from ..model.grouping import GroupSpec
from ..policy import DiskTier, SharedRamTier, Tier
from ..runtime.source import WeightSource
from ..transfer.backend import Backend
from .host_slab import HostSlabSource
from .origin import Origin
from .shared_slab import SharedSlabSource

#: A group's source and the forms its tensors take while it is not computing.
Made = tuple[WeightSource, list[torch.Tensor]]


@dataclass(frozen=True)
class Placed:
    """A streamed group as a kind sees it: ``packed`` is its slab, filled; ``verbatim``:
    its bytes were read from the checkpoint as stored (Origin.fill); ``pinned``: the slab is
    page-locked."""

    spec: GroupSpec
    packed: torch.Tensor
    verbatim: bool
    pinned: bool = False  # ``packed`` is page-locked (the pinned tier, under its limit)


class Placing(Protocol):
    """What a kind may ask of the placement."""

    tier: Tier
    origin: Origin
    backend: Backend

    def write_group(self, spec: GroupSpec, packed: torch.Tensor) -> ReadPlan:
        """Writes the group's file (Ferry's folder); its checked read plan."""
        ...

    def group_file_source(self, spec: GroupSpec, plan: ReadPlan) -> Made:
        """The source reading a group file: mapped or copied (``choose_cpu_read``)."""
        ...

    def checkpoint_forms(self, spec: GroupSpec, plan: ReadPlan) -> list[torch.Tensor]:
        """Views of the checkpoint's mapping at each tensor's stored bytes."""
        ...


Kind = Callable[[Placing, Placed], Made | None]


def shared_ram(p: Placing, g: Placed) -> Made | None:
    """The group's bytes (``packed``: the layout's scratch) as a shared segment, mapped;
    registered for pinned copies where the backend can."""
    if not isinstance(p.tier, SharedRamTier):
        return None
    ns = namespace()
    held = ns.hold(g.packed)
    try:
        pinned = p.backend.can_pin and p.backend.register_host(held.data)
    except BaseException:
        ns.release(held)
        raise
    return SharedSlabSource(held, ns, pinned), [e.build(held.data) for e in g.spec.entries]


def host_slab(p: Placing, g: Placed) -> Made | None:
    if isinstance(p.tier, (DiskTier, SharedRamTier)):
        return None
    return HostSlabSource(g.packed, g.pinned), [e.build(g.packed) for e in g.spec.entries]


def checkpoint(p: Placing, g: Placed) -> Made | None:
    tier = p.tier
    if not isinstance(tier, DiskTier):
        return None
    plan = p.origin.read_plan(g.spec, g.packed, g.verbatim, tier.direct_io)
    if plan is None:
        return None
    plan.verify_every_read = tier.verify == "every_read"
    return FileSource(plan), p.checkpoint_forms(g.spec, plan)


def group_file(p: Placing, g: Placed) -> Made | None:
    if not isinstance(p.tier, DiskTier):
        return None
    return p.group_file_source(g.spec, p.write_group(g.spec, g.packed))


KINDS: list[tuple[str, Kind]] = [
    ("host_slab", host_slab),
    ("shared_ram", shared_ram),
    ("checkpoint", checkpoint),
    ("group_file", group_file),
]


def make_source(p: Placing, g: Placed) -> Made:
    """The first kind's source that takes the group."""
    for _, kind in KINDS:
        made = kind(p, g)
        if made is not None:
            return made
    raise AssertionError(f"no source kind takes group {g.spec.name}")  # group_file takes all


@contextmanager
def registered(name: str, kind: Kind, before: str = "host_slab") -> Iterator[None]:
    """``kind`` offered every group before the kind named ``before``, inside the block."""
    at = next(i for i, (n, _) in enumerate(KINDS) if n == before)
    KINDS.insert(at, (name, kind))
    try:
        yield
    finally:
        KINDS.remove((name, kind))
