"""Repairing a streamed group whose file was damaged, under the engine (its ``repair``).

The group's file is written anew from its source of truth (disk/repair.py's
``slab_from_truth``) and the group gets a fresh source on the same read path and fresh host
forms. [Note: repairing a group under the engine] in disk/repair.py says when this is safe.
"""

from __future__ import annotations

import logging

import torch

from ..disk.plan import ReadPlan
from ..disk.repair import slab_from_truth
from ..model.layout import Entry
from ..runtime.group import GroupRuntime
from .give_back import meta_form
from .placement import META, Placement, point_all

log = logging.getLogger("ferry")


def repair_group(placement: Placement, rt: GroupRuntime) -> bool:
    """Rewrites the group's damaged file from its source of truth; False when it has
    none. See [Note: repairing a group under the engine] in disk/repair.py."""
    slab = slab_from_truth(placement.store, rt.source.file_plan, rt.spec, placement.origin)
    if slab is None:
        return False
    plan = rewrite_group(placement, rt, slab)
    log.warning(
        "ferry: %s was damaged; rewrote it from %s", plan.path.name, placement.origin.truth_name()
    )
    return True


def rewrite_group(placement: Placement, rt: GroupRuntime, slab: torch.Tensor) -> ReadPlan:
    """The group's file written anew from ``slab`` (its folder made again if deleted);
    the group gets a fresh source on the same read path and fresh host forms.
    [Note: repairing a group under the engine] in disk/repair.py says when this is safe."""
    assert placement.store is not None
    old = rt.source

    def let_go() -> None:
        # Nothing of the old file may stay open or mapped when the new one takes its name
        # (Windows refuses the rename otherwise): the entries wait on meta until the new
        # forms, the mapping goes with its last view.
        point_all(rt.spec.entries, [_placeholder(e) for e in rt.spec.entries])
        rt.host_forms = []
        if old.file_plan is not None:
            placement.mappings.forget(old.file_plan.path)
        old.close(placement.backend)

    placement.store.reopen()
    plan = placement.write_group(rt.spec, slab, let_go)
    rt.source, rt.host_forms = placement.group_file_source(rt.spec, plan)
    point_all(rt.spec.entries, rt.host_forms)
    return plan


def _placeholder(e: Entry) -> torch.Tensor:
    """What an entry holds while its file is replaced: meta for a tensor whose home is a
    file, else untouched memory of its layout (never read: the new forms replace it in the
    same call, and pages never touched are never taken)."""
    return meta_form(e, META if e.orig_device == META else torch.device("cpu"))
