"""What the user asks for: small typed objects, validated before any work is done."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from .errors import ConfigError
from .units import GIB


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
    """Offloaded weights wait in page-locked (pinned) RAM: the fastest host-to-device copies.

    ``pin_limit``: at most this many bytes are pinned (None: as many as the system pins);
    the groups past it, or past what the system agrees to pin, wait in ordinary RAM and
    reach the device through the pinned staging buffers, as the RAM tier's do."""

    pin_limit: int | None = None

    def validate(self) -> None:
        n = self.pin_limit
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
            raise ConfigError("pin_limit", f"must be empty or a byte count >= 0, got {n!r}")


@dataclass(frozen=True)
class RamTier:
    """Offloaded weights wait in ordinary RAM: for machines that cap pinned memory. On a GPU
    they reach it through a small ring of pinned staging buffers (only those are pinned)."""

    def validate(self) -> None:
        pass


@dataclass(frozen=True)
class SharedRamTier:
    """Offloaded weights wait in RAM shared by every Ferry process of this user on the machine
    (disk/shared_segments.py): a group whose bytes another process already holds is mapped,
    not copied, so identical networks in two processes (one ComfyUI per GPU) take one copy.
    On a GPU each process registers its view for pinned copies where the platform allows.
    POSIX only (Linux, macOS): it needs file locks that die with their process."""

    def validate(self) -> None:
        pass


#: The disk tier's options, each a choice list every host shows (ComfyUI's widgets, the panel).
VerifyMode = Literal["first_read", "every_read"]
CpuRead = Literal["auto", "mapped", "copy"]
VERIFY_MODES: tuple[VerifyMode, ...] = get_args(VerifyMode)
CPU_READS: tuple[CpuRead, ...] = get_args(CpuRead)


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
    verify: VerifyMode = "first_read"
    #: On a CPU onload device: "mapped" computes straight from the group file's page cache
    #: (no slot, no copy; only the groups in the prefetch window are mapped), "copy" reads
    #: each group into a slot (faster where measured, but the slots are anonymous RAM),
    #: "auto" copies unless the slots would take much of the free RAM
    #: (disk/mapped.py: choose_cpu_read). On a GPU the groups are always copied.
    cpu_read: CpuRead = "auto"

    def __post_init__(self) -> None:
        if isinstance(self.path, str):  # the folder as typed, without the spaces around it
            object.__setattr__(self, "path", self.path.strip())

    def validate(self) -> None:
        parse_disk_path(self.path)
        self.validate_options()

    def validate_options(self) -> None:
        """All but the folder; checked for every tier, so a wrong one is never dropped unread."""
        if self.source_checkpoint is not None and not isinstance(self.source_checkpoint, str):
            raise ConfigError(
                "source_checkpoint",
                f"must be a safetensors file's path or empty, got {self.source_checkpoint!r:.60}",
            )
        if not isinstance(self.direct_io, bool):
            raise ConfigError("direct_io", f"must be true or false, got {self.direct_io!r}")
        if self.verify not in VERIFY_MODES:
            raise ConfigError("verify", f"must be one of {list(VERIFY_MODES)}, got {self.verify!r}")
        if self.cpu_read not in CPU_READS:
            raise ConfigError(
                "cpu_read", f"must be one of {list(CPU_READS)}, got {self.cpu_read!r}"
            )


#: ``bake_lora``: whether a streamed weight carrying patches (GGUF's LoRA) is computed once
#: at layout (model/bake.py: [Note: baking a patched weight]); "off" patches on every forward.
BakeMode = Literal["off", "on", "auto"]
BAKE_MODES: tuple[BakeMode, ...] = get_args(BakeMode)

Level = BlockLevel | LeafLevel
Tier = PinnedRamTier | RamTier | SharedRamTier | DiskTier
TierName = Literal["pinned", "ram", "shared", "disk"]
LevelName = Literal["block", "leaf"]
#: The choice lists every host shows (ComfyUI's widgets, Forge's controls, the panel), in order.
TIER_NAMES: tuple[TierName, ...] = get_args(TierName)
LEVEL_NAMES: tuple[LevelName, ...] = get_args(LevelName)
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
    bake_lora: BakeMode = "off"
    #: Where vram_budget is "auto" and the planner chose for this network (planner/apply.py):
    #: the VRAM it gave it while it runs, its resident share and its streaming slots. The
    #: layout keeps that share; what is free when it lays out (less the headroom) only caps
    #: it, as the planner counted free memory before the prompt's other networks loaded. Not
    #: part of what the policy is (compare=False): like "auto" itself it is resolved once per
    #: layout, so a later plan whose free-VRAM figure moved by a few bytes does not lay a kept
    #: network out again.
    planned_vram: int | None = field(default=None, compare=False)

    def validate(self) -> None:
        parse_bake_lora(self.bake_lora)
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
        p = self.planned_vram
        if p is not None and (isinstance(p, bool) or not isinstance(p, int) or p < 0):
            raise ConfigError("planned_vram", f"must be empty or a byte count >= 0, got {p!r}")

    @property
    def tier_name(self) -> TierName:
        if isinstance(self.tier, DiskTier):
            return "disk"
        if isinstance(self.tier, SharedRamTier):
            return "shared"
        return "ram" if isinstance(self.tier, RamTier) else "pinned"

    @property
    def level_name(self) -> LevelName:
        return "leaf" if isinstance(self.level, LeafLevel) else "block"

    def to_dict(self) -> dict[str, Any]:
        """The flat form the settings file, the nodes and the panel use.

        Byte counts are written as exact GB floats (bytes / 2**30 is exact below 2**53), so
        ``from_dict(to_dict())`` gives back the same policy; views round them for display.
        The disk tier's options are None for the other tiers (like ``disk_path``).
        """
        budget = self.vram_budget
        disk = self.tier if isinstance(self.tier, DiskTier) else None
        return {
            "level": self.level_name,
            "blocks_per_group": getattr(self.level, "blocks_per_group", 1),
            "tier": self.tier_name,
            "disk_path": disk.path if disk else None,
            "source_checkpoint": disk.source_checkpoint if disk else None,
            "direct_io": disk.direct_io if disk else None,
            "verify": disk.verify if disk else None,
            "cpu_read": disk.cpu_read if disk else None,
            "prefetch_depth": self.prefetch_depth,
            "vram_budget_gb": budget if budget is None or budget == AUTO else budget / GIB,
            "headroom_gb": self.headroom_bytes / GIB,
            "bake_lora": self.bake_lora,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OffloadPolicy:
        """Builds and validates a policy from the flat form; unknown keys are an error.

        Values may be what a widget holds ("6", 2.0) as well as what the file holds: each
        goes through the one parser of its setting (``parse_*`` in settings.py).
        """
        unknown = set(d) - FLAT_KEYS
        if unknown:
            raise ConfigError(sorted(unknown)[0], f"unknown setting; known: {sorted(FLAT_KEYS)}")
        policy = cls(
            level=_level_from_dict(d),
            tier=_tier_from_dict(d),
            prefetch_depth=parse_prefetch_depth(d.get("prefetch_depth", 1)),
            vram_budget=parse_vram_budget(d.get("vram_budget_gb")),
            headroom_bytes=parse_headroom(d.get("headroom_gb", DEFAULT_HEADROOM_GB)),
            bake_lora=parse_bake_lora(d.get("bake_lora") or "off"),
        )
        policy.validate()
        return policy


#: The keys of the flat form (``OffloadPolicy.to_dict``).
FLAT_KEYS = frozenset(
    {
        "level", "blocks_per_group", "tier", "disk_path", "source_checkpoint", "direct_io",
        "verify", "cpu_read", "prefetch_depth", "vram_budget_gb", "headroom_gb", "bake_lora",
    }
)  # fmt: skip


def _level_from_dict(d: dict[str, Any]) -> Level:
    level_name = d.get("level", "block")
    if level_name == "block":
        return BlockLevel(parse_blocks_per_group(d.get("blocks_per_group", 1)))
    if level_name == "leaf":
        return LeafLevel()
    raise ConfigError("level", f"must be 'block' or 'leaf', got {level_name!r}")


def _tier_from_dict(d: dict[str, Any]) -> Tier:
    tier_name = d.get("tier", "pinned")
    if tier_name not in TIER_NAMES:
        raise ConfigError("tier", f"must be one of {list(TIER_NAMES)}, got {tier_name!r:.60}")
    defaults = DiskTier("")
    # None (the flat form of a non-disk tier, or a widget left empty) means the default.
    options = {k: d.get(k) for k in ("direct_io", "verify", "cpu_read")}
    path = d.get("disk_path")
    if path is not None and not isinstance(path, str):
        raise ConfigError("disk_path", f"must be a folder's path or empty, got {path!r:.60}")
    disk = DiskTier(
        path or "",
        d.get("source_checkpoint"),
        **{k: getattr(defaults, k) if v is None else v for k, v in options.items()},
    )
    if tier_name == "pinned":
        disk.validate_options()  # unused by this tier, but a wrong one is still refused
        return PinnedRamTier()
    if tier_name == "ram":
        disk.validate_options()
        return RamTier()
    if tier_name == "shared":
        disk.validate_options()
        return SharedRamTier()
    return disk


# ---- One parser per setting -----------------------------------------------------------------
# The node's widgets, the panel's form, the settings file and OffloadPolicy.from_dict all send
# their raw values through these, so one input gets one verdict everywhere. Each error names
# the setting and says what to type.

DEFAULT_HEADROOM_GB = 2.0
#: A plain decimal number of GB, optionally followed by "GB". Deliberately not float()'s
#: grammar: float() also takes "1e3", "inf", "nan" and "1_0", which nobody means in a GB box
#: and which would otherwise each need their own rejection.
_GB_TEXT = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(?:gib|gb)?")
#: Texts that mean "no budget": stream every group.
_NO_BUDGET = ("", "none", "off")
_BUDGET_HELP = (
    "type a number of GiB above 0 (e.g. 6 or 7.5), 'auto' to use the VRAM that is free, "
    "or leave it empty to stream every group"
)


def parse_vram_budget(value: Any) -> int | Literal["auto"] | None:
    """A VRAM budget as a user, widget or file gives it -> bytes, "auto" or None.

    None/"" (and "none", "off") stream every group; "auto" keeps what fits in free memory;
    a number is GB. Zero ("0", 0.0) also means "stream every group": a budget of no bytes
    for resident groups keeps none resident, which is exactly what empty does, and ComfyUI
    workflows saved with "0" (the node's old spelling of "no budget") keep loading with the
    meaning they were saved with. Negative numbers and anything else are refused.
    """
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    return parse_gib("vram_budget_gb", value, _BUDGET_HELP)


#: What an empty disk-folder box is asked for (the read-only check says it as it is typed).
ASK_FOR_FOLDER = "type a folder on a fast disk (an SSD/NVMe), e.g. /mnt/nvme/ferry"


def parse_disk_path(value: Any, default: str | None = None, flavour: Any = os.path) -> str:
    """The disk tier's folder as a user, widget or file gives it: a full path (``~`` counts),
    returned as typed without the spaces around it. Empty is ``default``, where a host has
    one (the ComfyUI node: ComfyUI's temp folder), else refused; a relative path is refused
    everywhere (it would depend on the directory a host was started from). Whether the
    folder is usable is the read-only check's (disk/folder.py) and the disk tier's.
    ``flavour`` is the platform's ``os.path`` (tests give ``ntpath``: on Windows a full path
    starts with a drive, ``C:\\models``, or is a share, ``\\\\nas\\share``)."""
    raw = value.strip() if isinstance(value, str) else ""
    if value is not None and not isinstance(value, str):
        raise ConfigError("disk_path", f"must be a folder's path, got {value!r}")
    if not raw:
        if default:
            return parse_disk_path(default, flavour=flavour)
        raise ConfigError("disk_path", ASK_FOR_FOLDER)
    if "\x00" in raw:
        # Path.exists() answers False for a NUL byte instead of failing: refuse it here.
        raise ConfigError("disk_path", "not a usable path (it contains a NUL character)")
    try:
        full = flavour.isabs(flavour.expanduser(raw))
    except ValueError as e:  # a path the OS cannot represent
        raise ConfigError("disk_path", f"not a usable path ({e})") from None
    if not full:
        raise ConfigError("disk_path", f"use a full path (starting with / or a drive), not {raw!r}")
    return raw


def parse_gib(setting: str, value: Any, help_text: str) -> int | None:
    """An amount of memory in GB (GiB: units.py) as a user, widget or file gives it ->
    bytes; None for "no amount" (empty, "none", "off", 0). ``help_text`` says what to type."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(setting, f"{value!r} is not a budget; {help_text}")
    if isinstance(value, (int, float)):
        gb = float(value)
    else:
        text = str(value).strip().lower()
        if text in _NO_BUDGET:
            return None
        if not _GB_TEXT.fullmatch(text):
            raise ConfigError(setting, f"{value!r} is not a budget; {help_text}")
        gb = float(_GB_TEXT.fullmatch(text).group(1))  # type: ignore[union-attr]
    # gb * GIB too: 1e308 GiB is a finite float whose bytes are not (int() would raise).
    if not math.isfinite(gb * GIB) or gb < 0:
        raise ConfigError(setting, f"{value!r:.60} is not a budget; {help_text}")
    n = int(gb * GIB)
    if n == 0 and gb > 0:
        raise ConfigError(setting, f"{value!r} GiB is less than one byte; {help_text}")
    return None if n == 0 else n


def parse_whole_number(setting: str, value: Any, low: int, high: int | None = None) -> int:
    """A whole number from a widget: 2, 2.0 (sliders give floats) or "2"; never 2.5 or True."""
    whole_float = isinstance(value, float) and value.is_integer()
    whole_text = isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value) is not None
    n: Any = int(value) if whole_float or whole_text else value
    limits = f">= {low}" if high is None else f"{low}..{high}"
    if isinstance(n, bool) or not isinstance(n, int) or n < low or (high and n > high):
        raise ConfigError(setting, f"must be a whole number {limits}, got {value!r}")
    return n


def parse_blocks_per_group(value: Any) -> int:
    """Blocks per group: a whole number >= 1. The upper bound is the model's (the grouping
    checks it against the longest block list), so a huge number passes here and fails there."""
    try:
        return parse_whole_number("blocks_per_group", value, 1)
    except ConfigError as e:
        raise ConfigError("blocks_per_group", f"{_reason(e)}; try 1 or 2") from None


def parse_bake_lora(value: Any) -> BakeMode:
    """``bake_lora``'s one parser: "off", "on" or "auto" (a bool: on/off)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, str) and value.strip().lower() in BAKE_MODES:
        return value.strip().lower()  # type: ignore[return-value]
    raise ConfigError("bake_lora", f"must be one of {list(BAKE_MODES)}, got {value!r}")


def parse_prefetch_depth(value: Any) -> int:
    return parse_whole_number("prefetch_depth", value, 1, 8)


def parse_headroom(value: Any) -> int:
    """The headroom for "auto" in GB (>= 0; empty = the default) -> bytes."""
    if value is None or (isinstance(value, str) and not value.strip()):
        value = DEFAULT_HEADROOM_GB
    if isinstance(value, str) and _GB_TEXT.fullmatch(value.strip().lower()):
        value = float(_GB_TEXT.fullmatch(value.strip().lower()).group(1))  # type: ignore[union-attr]
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ConfigError("headroom_gb", f"must be a number of GiB >= 0, got {value!r}")
    return int(value * GIB)


def _reason(e: ConfigError) -> str:
    return str(e).removeprefix(f"{e.setting}: ")
