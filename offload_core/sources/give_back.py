"""Giving the weights back when a layout ends, group by group ([Note: release by kind of
ending] in offload_core/ending.py): ``restore_all`` gives every tensor back (a fresh tensor of
its own), ``drop_all`` drops Ferry's copies without reading them (the tensors go to the meta
device); either deletes Ferry's files once no group is left. A layout that fails half-way is
put back by ``restore_all`` too (lay_out.py).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from ..errors import CorruptGroupFileError, RestoreIncompleteError, WeightsLostError
from ..model.layout import Entry
from ..runtime.group import GroupRuntime
from ..runtime.memory import HeapTrimmer
from ..transfer.backend import Backend
from .placement import META, Placement, move_tensor
from .resident import ResidentGroup

log = logging.getLogger("ferry")


def restore_all(placement: Placement) -> None:
    """Every tensor back on its original device, as a fresh ordinary tensor (a tensor
    whose home is its checkpoint back on the meta device, read from nowhere).

    Group by group: a group's copy (its slab, its file's descriptors) is let go as soon as
    its tensors hold their own bytes again, so the model is never twice in memory.

    Only damage loses a group: a group whose only copy is a file whose bytes are wrong
    (``CorruptGroupFileError``) goes to the meta device. Any other error (the platform
    refusing a call, Ferry's own bug, an interrupt, no memory) keeps the group as it was,
    its file and descriptors too, and is raised once the others are restored: calling
    this again restores what is left. See ``RestoreIncompleteError``."""
    placement.origin.restore_outside()
    damage: CorruptGroupFileError | None = None
    lost: list[GroupRuntime | ResidentGroup] = []
    kept: list[GroupRuntime | ResidentGroup] = []
    failed: BaseException | None = None
    # Taken off the list one at a time: a restored group is then held by nothing, and its
    # copy is freed before the next group's fresh tensors are made.
    todo, placement.runtimes = placement.runtimes, kept
    todo.reverse()
    trimmer = HeapTrimmer()
    while todo:
        rt = todo.pop()
        trimmer.freed(rt.spec.nbytes)  # the copies and read buffers freed so far
        try:
            restore_group(rt, placement.backend)
        except CorruptGroupFileError as e:  # the file's bytes say so: nothing to read back
            log.error("ferry: restoring group %s failed: %s", rt.name, e)
            damage = damage or e
            lost.append(rt)
            drop_group(rt, placement.backend)
        except BaseException as e:  # not the file's fault: keep the group as it is
            log.error("ferry: restoring group %s failed (kept, not dropped): %r", rt.name, e)
            failed = failed or e
            kept.append(rt)
        del rt
    if not kept:
        for m, attr, is_param, dev in reversed(placement.outside_moved):
            move_tensor(m, attr, is_param, dev)
        _forget_files(placement)
    if failed is not None:
        if not isinstance(failed, Exception):
            raise failed  # an interrupt stays an interrupt; remove() again finishes
        raise RestoreIncompleteError([rt.name for rt in kept], failed) from failed
    if damage is not None:
        raise lost_error(lost, damage)


def drop_all(placement: Placement) -> None:
    """The network is being discarded: every group's copy is dropped without a read (its
    tensors go to the meta device), its files deleted; the tensors outside the groups stay
    where they are and go with the network. Never raises for a damaged file: nothing is
    read."""
    todo, placement.runtimes = placement.runtimes, []
    while todo:
        drop_group(todo.pop(), placement.backend)
    _forget_files(placement)


def _forget_files(placement: Placement) -> None:
    """Once no group is left: the outside tensors' old places, the mappings and Ferry's
    folder go (a damaged or discarded layout's files are worth nothing: never left)."""
    placement.outside_moved.clear()
    placement.mappings.clear()
    if placement.store is not None:
        placement.store.delete()


def restore_group(rt: GroupRuntime | ResidentGroup, backend: Backend) -> None:
    """The group's tensors hold their own bytes again (read from its source), and its
    source is closed."""
    spec = rt.spec
    if all(e.orig_device == META for e in spec.entries):
        for e in spec.entries:  # back in the file: on meta, a tensor subclass as such
            e.put(meta_form(e))
    else:
        src = rt.source.host_bytes(spec.nbytes)
        for e in spec.entries:
            e.point_at(fresh(e, src))
    rt.host_forms = []
    rt.source.close(backend)


def fresh(e: Entry, src: torch.Tensor) -> torch.Tensor:
    """A new tensor on the entry's original device holding its bytes from ``src``."""
    inner = []
    for part in e.parts:
        t = torch.empty_strided(part.size, part.stride, dtype=part.dtype, device=e.orig_device)
        t.copy_(part.view(src))
        inner.append(t)
    if e.subclass is None:
        return inner[0]
    rebuilt = e.subclass.__tensor_unflatten__(  # type: ignore[attr-defined]
        dict(zip(e.inner_names, inner)), e.ctx, e.outer_size, e.outer_stride
    )
    return nn.Parameter(rebuilt, requires_grad=e.requires_grad) if e.is_param else rebuilt


def drop_group(rt: GroupRuntime | ResidentGroup, backend: Backend) -> None:
    """A group whose bytes cannot be read back, or that nobody will read (a discarded
    network): its tensors go to the meta device (a model that uses them fails loudly, never
    computes on garbage) and its source is closed."""
    for e in rt.spec.entries:
        e.put(meta_form(e))
    rt.host_forms = []
    try:
        rt.source.close(backend)
    except OSError as e:  # the descriptor is gone with the file's weights: nothing to keep
        log.debug("ferry: closing %s: %s", rt.name, e)


def meta_form(e: Entry, device: torch.device = META) -> torch.Tensor:
    """The entry's tensor on the meta device (or an uninitialised one on ``device``), built
    from its recorded layout (a tensor subclass such as torchao's cannot always be asked for
    ``empty_like``)."""
    inner = [torch.empty_strided(p.size, p.stride, dtype=p.dtype, device=device) for p in e.parts]
    if e.subclass is None:
        return inner[0]
    return e.subclass.__tensor_unflatten__(  # type: ignore[attr-defined, no-any-return]
        dict(zip(e.inner_names, inner)), e.ctx, e.outer_size, e.outer_stride
    )


def lost_error(
    lost: list[GroupRuntime | ResidentGroup], first: CorruptGroupFileError
) -> WeightsLostError:
    """The error remove() raises once everything else is restored: the groups damage lost."""
    files = [str(rt.source.file_plan.path if rt.source.file_plan else rt.name) for rt in lost]
    return WeightsLostError([rt.name for rt in lost], files, first)
