"""The tier and level choices as every host shows them: offload_core/policy.py's names, in
its order, each with the words a radio button shows (a host may word one its own way)."""

from __future__ import annotations

from collections.abc import Mapping

from ..offload_core.policy import LEVEL_NAMES, TIER_NAMES

TIER_LABELS: Mapping[str, str] = {
    "pinned": "Pinned RAM (fastest)",
    "ram": "RAM",
    "shared": "Shared RAM (one copy for every process)",
    "disk": "Disk (SSD/NVMe)",
}
LEVEL_LABELS: Mapping[str, str] = {
    "block": "Groups of blocks",
    "leaf": "Layer by layer (least VRAM, slowest)",
}


def tier_choices(**words: str) -> list[tuple[str, str]]:
    """(label, name) per tier, in the policy's order; ``words`` rewords some by name."""
    return [(words.get(n, TIER_LABELS[n]), n) for n in TIER_NAMES]


def level_choices(**words: str) -> list[tuple[str, str]]:
    """(label, name) per level, in the policy's order; ``words`` rewords some by name."""
    return [(words.get(n, LEVEL_LABELS[n]), n) for n in LEVEL_NAMES]
