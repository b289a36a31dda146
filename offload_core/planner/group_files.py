"""Whether the disk tier reads a network's groups in place from the file it was loaded from,
or writes them as group files into its folder, and how many bytes: one answer for the
pre-flight (from the file's header) and for the run (from the laid-out plan), so the plan
cannot say "disk 0 B" for a network whose run writes its groups, nor the run ask for room the
plan never counted.

A group is read in place only where there is a file to read it from (``source``: the file
the host loaded the network from, as the run will be told it) and the host holds every tensor
of the group exactly as that file stores it (same dtype and shape: no cast, no quantization,
no LoRA baked in). Every other streamed group is written.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..model.plan import OffloadPlan
from ..policy import DiskTier
from ..sources.origin import ModelOrigin


@dataclass(frozen=True)
class GroupFiles:
    """Where a network's streamed groups come from on the disk tier."""

    source: str | None  # the file groups are read from in place (None: none, all written)
    read_in_place: int  # bytes read from ``source`` as it stores them
    written: int  # bytes written as group files into the disk folder

    @property
    def in_place(self) -> bool:
        """Nothing is written: every streamed group is read from ``source``."""
        return self.written == 0


def group_files(source: str | None, groups: Iterable[tuple[int, bool]]) -> GroupFiles:
    """``groups``: each streamed group's bytes and whether the host holds it as ``source``
    stores it. The pre-flight passes the whole network as one (the header says whether the
    host casts it); the run passes each group of its plan (``plan_group_files``)."""
    in_place = written = 0
    for nbytes, as_stored in groups:
        if source is not None and as_stored:
            in_place += nbytes
        else:
            written += nbytes
    return GroupFiles(source, in_place, written)


def plan_group_files(plan: OffloadPlan) -> GroupFiles:
    """The run's answer for a plan on the disk tier: its policy's ``source_checkpoint`` (the
    file the node found the network was loaded from) and, for each streamed group, whether
    that file holds every tensor of it as stored (read from the header alone, as the layout
    decides: ``ModelOrigin.verbatim``)."""
    tier = plan.policy.tier
    source = tier.source_checkpoint if isinstance(tier, DiskTier) else None
    origin = ModelOrigin()
    notes: list[str] = []
    with origin.opened(plan, notes):
        as_stored = [
            (g.nbytes, origin.verbatim(g.entries))
            for g, gp in zip(plan.grouping.groups, plan.groups)
            if not gp.resident
        ]
    # The origin is the judge of what is read in place (the file named, or one the weights
    # are still a mapping of): a group it reads from a file has a source.
    read = any(v for _, v in as_stored)
    return group_files(
        (source or "the file the weights are a mapping of") if read else None, as_stored
    )
