"""What the user asks for: small typed objects, validated before any work is done."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from .errors import ConfigError

GIB = 1 << 30


@dataclass(frozen=True)
class BlockLevel:
    """Groups of ``blocks_per_group`` consecutive blocks from the model's block lists."""

    blocks_per_group: int = 1

    def validate(self) -> None:
        n = self.blocks_per_group
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(
                "blocks_per_group", f"must be a whole number >= 1, got {n!r}; try 1 or 2"
            )


@dataclass(frozen=True)
class LeafLevel:
    """One group per leaf module that owns parameters (finest grain, most transfers)."""

    def validate(self) -> None:
        pass


@dataclass(frozen=True)
class PinnedRamTier:
    """Offloaded weights wait in page-locked (pinned) RAM: the fastest host-to-device copies."""

    def validate(self) -> None:
        pass


@dataclass(frozen=True)
class RamTier:
    """Offloaded weights wait in ordinary RAM: for machines that cap pinned memory."""

    def validate(self) -> None:
        pass


@dataclass(frozen=True)
class DiskTier:
    """Offloaded weights wait on disk/NVMe under ``path`` (a folder Ferry owns).

    Where ``source_checkpoint`` names the safetensors file the model was loaded from and a
    group's weights are unchanged since, the group is read straight from that file and
    nothing is written.
    """

    path: str
    source_checkpoint: str | None = None
    #: Read group files with O_DIRECT where the filesystem allows: no page-cache copy, less
    #: CPU, and the page cache is left to the rest of the machine. Off: buffered reads
    #: (faster only when the group files fit in the page cache anyway).
    direct_io: bool = True
    #: When the chunks' CRC32s are checked: "first_read" (each group once per process; every
    #: read still checks the file's identity, which any write changes) or "every_read".
    verify: Literal["first_read", "every_read"] = "first_read"
    #: On a CPU onload device: "mapped" computes straight from the group file's page cache
    #: (no slot, no copy; only the groups in the prefetch window are mapped), "copy" reads
    #: each group into a slot (faster where measured, but the slots are anonymous RAM),
    #: "auto" copies unless the slots would take much of the free RAM
    #: (sources/placement.py: choose_cpu_read). On a GPU the groups are always copied.
    cpu_read: Literal["auto", "mapped", "copy"] = "auto"

    def validate(self) -> None:
        if not isinstance(self.path, str) or not self.path.strip():
            raise ConfigError("disk_path", "the disk tier needs a folder; set disk_path")
        if self.verify not in ("first_read", "every_read"):
            raise ConfigError(
                "verify", f"must be 'first_read' or 'every_read', got {self.verify!r}"
            )
        if self.cpu_read not in ("auto", "mapped", "copy"):
            raise ConfigError(
                "cpu_read", f"must be 'auto', 'mapped' or 'copy', got {self.cpu_read!r}"
            )


Level = BlockLevel | LeafLevel
Tier = PinnedRamTier | RamTier | DiskTier
TierName = Literal["pinned", "ram", "disk"]
LevelName = Literal["block", "leaf"]
AUTO: Literal["auto"] = "auto"


@dataclass(frozen=True)
class OffloadPolicy:
    """How to offload one model.

    vram_budget: None streams every group; an int (bytes) or "auto" (free device memory
    minus ``headroom_bytes``) keeps as many groups resident as fit beside the streaming
    slots.
    """

    level: Level = BlockLevel()
    tier: Tier = PinnedRamTier()
    prefetch_depth: int = 1
    vram_budget: int | Literal["auto"] | None = None
    headroom_bytes: int = 2 * GIB

    def validate(self) -> None:
        self.level.validate()
        self.tier.validate()
        d = self.prefetch_depth
        if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= 8:
            raise ConfigError("prefetch_depth", f"must be a whole number 1..8, got {d!r}")
        b = self.vram_budget
        if (
            b is not None
            and b != AUTO
            and (isinstance(b, bool) or not isinstance(b, int) or b <= 0)
        ):
            raise ConfigError(
                "vram_budget", f"must be 'auto', empty, or a positive byte count, got {b!r}"
            )
        if not isinstance(self.headroom_bytes, int) or self.headroom_bytes < 0:
            raise ConfigError("headroom_bytes", f"must be >= 0, got {self.headroom_bytes!r}")

    @property
    def tier_name(self) -> TierName:
        if isinstance(self.tier, DiskTier):
            return "disk"
        return "ram" if isinstance(self.tier, RamTier) else "pinned"

    @property
    def level_name(self) -> LevelName:
        return "leaf" if isinstance(self.level, LeafLevel) else "block"

    def to_dict(self) -> dict[str, Any]:
        """The flat form the settings file, the nodes and the panel use."""
        budget: float | str | None
        if self.vram_budget is None or self.vram_budget == AUTO:
            budget = self.vram_budget
        else:
            budget = round(int(self.vram_budget) / GIB, 3)
        return {
            "level": self.level_name,
            "blocks_per_group": getattr(self.level, "blocks_per_group", 1),
            "tier": self.tier_name,
            "disk_path": getattr(self.tier, "path", None),
            "source_checkpoint": getattr(self.tier, "source_checkpoint", None),
            "prefetch_depth": self.prefetch_depth,
            "vram_budget_gb": budget,
            "headroom_gb": round(self.headroom_bytes / GIB, 3),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OffloadPolicy:
        """Builds and validates a policy from the flat form; unknown keys are an error."""
        known = {
            "level", "blocks_per_group", "tier", "disk_path", "source_checkpoint",
            "prefetch_depth", "vram_budget_gb", "headroom_gb",
        }  # fmt: skip
        unknown = set(d) - known
        if unknown:
            raise ConfigError(sorted(unknown)[0], f"unknown setting; known: {sorted(known)}")
        level_name = d.get("level", "block")
        level: Level
        if level_name == "block":
            level = BlockLevel(d.get("blocks_per_group", 1))
        elif level_name == "leaf":
            level = LeafLevel()
        else:
            raise ConfigError("level", f"must be 'block' or 'leaf', got {level_name!r}")
        tier_name = d.get("tier", "pinned")
        tier: Tier
        if tier_name == "pinned":
            tier = PinnedRamTier()
        elif tier_name == "ram":
            tier = RamTier()
        elif tier_name == "disk":
            tier = DiskTier(d.get("disk_path") or "", d.get("source_checkpoint"))
        else:
            raise ConfigError("tier", f"must be 'pinned', 'ram' or 'disk', got {tier_name!r}")
        policy = cls(
            level=level,
            tier=tier,
            prefetch_depth=d.get("prefetch_depth", 1),
            vram_budget=_budget_from_gb(d.get("vram_budget_gb")),
            headroom_bytes=_bytes_from_gb("headroom_gb", d.get("headroom_gb", 2.0)),
        )
        policy.validate()
        return policy


def _bytes_from_gb(setting: str, gb: Any) -> int:
    if isinstance(gb, bool) or not isinstance(gb, (int, float)) or not math.isfinite(gb) or gb < 0:
        raise ConfigError(setting, f"must be a number of GB >= 0, got {gb!r}")
    return int(gb * GIB)


def _budget_from_gb(gb: Any) -> int | Literal["auto"] | None:
    if gb is None or gb == "":
        return None
    if gb == AUTO:
        return AUTO
    if isinstance(gb, str):
        try:
            gb = float(gb)
        except ValueError:
            raise ConfigError(
                "vram_budget_gb", f"must be 'auto', empty or a number, got {gb!r}"
            ) from None
    n = _bytes_from_gb("vram_budget_gb", gb)
    if n <= 0:
        raise ConfigError("vram_budget_gb", "must be > 0 GB, 'auto', or empty for no budget")
    return n
