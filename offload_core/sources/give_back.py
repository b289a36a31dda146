"""What becomes of one group's tensors when a layout ends (``Placement.restore_all`` and
``drop_all``; offload_core/ending.py, [Note: release by kind of ending]): a fresh tensor of its
own (restored), or a form on the meta device (dropped: damaged, or discarded unread)."""

from __future__ import annotations

import logging

import torch
from torch import nn

from ..errors import CorruptGroupFileError, WeightsLostError
from ..model.layout import Entry
from ..runtime.group import GroupRuntime
from ..transfer.backend import Backend
from .resident import ResidentGroup

log = logging.getLogger("ferry")
META = torch.device("meta")


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
