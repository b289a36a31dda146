"""How an offload ends: what ``OffloadHandle.remove`` does with Ferry's copies of the weights.

[Note: release by kind of ending]
Giving the weights back costs what the layout holds: the RAM tiers' slabs are copied into fresh
tensors, the disk tier's groups are read from their files. That is worth it only for a host
that goes on using the network without Ferry. So an offload ends one of two ways, and the host,
which alone knows why it lets go, says which:

- ``RESTORE``: the host keeps the network (a plain load of it follows, or a re-layout: the
  next layout starts from the plain network). Every tensor comes back, group by group: each
  group's copy is freed as soon as its tensors hold their own bytes again, so the network is
  never twice in memory (at most its size and one group). A tensor whose home is its checkpoint
  (a network built on meta) goes back to meta and nothing is read: the next layout reads it
  again from the file.
- ``DISCARD``: the network is going away (the host dropped every object that could use it).
  Ferry's copies are dropped where they lie: nothing is read from a group file or a
  checkpoint, nothing is copied; the group tensors go to the meta device, so a network that
  someone did keep fails loudly instead of computing on freed memory. Files are deleted,
  pinned memory unregistered, descriptors closed.

A re-layout is a RESTORE followed by a new layout, which moves the tensors group by group
again (each group's original storage freed as its copy lands): its peak is the network's plain
size plus a group or two, never the old layout and the new one together.
"""

from __future__ import annotations

import enum

from .errors import ConfigError


class Ending(enum.Enum):
    """See [Note: release by kind of ending]."""

    RESTORE = "restore"
    DISCARD = "discard"


def parse_ending(value: object) -> Ending:
    """An ``Ending`` or its value ("restore", "discard"); anything else is refused by name,
    before anything is released."""
    try:
        return Ending(value)
    except ValueError:
        choices = ", ".join(repr(e.value) for e in Ending)
        raise ConfigError("ending", f"must be one of {choices}, got {value!r}") from None
