"""What the planner decides from: the machine's figures and each network's, as small typed
objects. Pure data: reading them from the real machine is machine.py's job, from a model's
file network_file.py's, so the decisions (choose.py) are tested on fake machines."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError
from ..offload_kind import OffloadKind, network_kind
from ..policy import TIER_NAMES, TierName
from ..units import GIB

#: Figures the planner assumes where it cannot read them. Each is said as "assumed" in a
#: choice's sentence, never passed off as measured.
#: A disk read: a SATA SSD's sustained read; NVMe is faster, a hard disk slower.
ASSUMED_DISK_GBPS = 0.5
#: Copies into VRAM from pinned RAM (PCIe 4 x16 reaches ~25) and from ordinary RAM (the
#: driver stages pageable memory through its own pinned buffer: about half).
ASSUMED_PINNED_GBPS = 12.0
ASSUMED_RAM_GBPS = 6.0
#: On a CPU onload device a group is copied RAM to RAM: memory bandwidth, shared with compute.
ASSUMED_CPU_COPY_GBPS = 4.0
#: How fast compute consumes a network's weights (bytes of weights a second while it runs):
#: a diffusion step on a current GPU reads its 12-24 GB of weights in about a second; a CPU
#: is tens of times slower. Look-ahead is sized against it.
ASSUMED_GPU_COMPUTE_GBPS = 20.0
ASSUMED_CPU_COMPUTE_GBPS = 0.5
#: RAM left free beside everything Ferry plans: the OS, the host's own work (latents, the VAE,
#: the text encoder's activations) and the page cache the loaders read through.
DEFAULT_RAM_HEADROOM = 2 * GIB

#: What a network is: a row of offload_kind.py's table (a VAE is listed, and its RAM counted,
#: but never offloaded by Ferry).
Kind = OffloadKind


@dataclass(frozen=True)
class Wish:
    """What a user set for one network; None is ``auto`` (the planner chooses)."""

    tier: TierName | None = None
    blocks_per_group: int | None = None
    prefetch_depth: int | None = None

    def validate(self) -> None:
        if self.tier is not None and self.tier not in TIER_NAMES:
            raise ConfigError("tier", f"must be 'auto' or one of {list(TIER_NAMES)}")
        for name, low, high in (("blocks_per_group", 1, None), ("prefetch_depth", 1, 8)):
            v = getattr(self, name)
            if v is not None and (
                isinstance(v, bool) or not isinstance(v, int) or v < low or (high and v > high)
            ):
                raise ConfigError(name, f"must be 'auto' or a whole number >= {low}, got {v!r}")


@dataclass(frozen=True)
class NetworkFacts:
    """One network a prompt loads, as its file tells (nothing loaded).

    ``block_bytes``: each block of its longest list of repeated blocks, as loaded (empty: it
    has none, and it moves as one group). ``reads_per_prompt``: how often a prompt reads all
    its weights (a diffusion model once per sampling step and forward; a text encoder once).
    ``in_place``: the disk tier can read it from its own file, so it writes nothing.
    ``held_bytes``: its weights already in this process's RAM (a loader read them), which
    laying it out moves rather than adds. ``block_bytes`` holds every list's blocks (each
    list is cut into groups); the longest list bounds blocks per group.
    """

    name: str
    kind: Kind
    nbytes: int
    block_bytes: tuple[int, ...] = ()
    file: str | None = None
    reads_per_prompt: float = 1.0
    in_place: bool = False
    held_bytes: int = 0
    wish: Wish = field(default_factory=Wish)
    #: Blocks in the longest list (bounds blocks per group); 0: ``len(block_bytes)``.
    longest_list: int = 0
    #: False: no Ferry node offloads it; the host keeps it whole in RAM (its tier is "ram").
    ferry: bool = True
    #: Its largest layer's dequantized copy in the compute dtype, made while that layer
    #: computes (a quantized format's: stored_sizes.py); memory of the onload device.
    transient_bytes: int = 0
    #: RAM its loader adds while it reads the file, and the pre-flight's sentence of it
    #: (loader_costs.py's table; 0 and None: no row for its loader on this host).
    load_peak_bytes: int = 0
    load_said: str | None = None
    #: Other live Ferry processes on this machine that hold this network on the shared RAM
    #: tier (disk/shared_segments.py): its bytes are already in RAM, once per machine, so on
    #: the shared tier this process adds none of them.
    shared_with: int = 0

    def __post_init__(self) -> None:
        # A kind's value ("text_encoder") is taken for its row, so every reader gets the row.
        object.__setattr__(self, "kind", network_kind(self.kind))

    @property
    def outside_bytes(self) -> int:
        """Its weights outside the repeated blocks: they never stream (the onload device
        holds them: RAM on a CPU)."""
        return self.nbytes - sum(self.block_bytes) if self.block_bytes else 0

    @property
    def title(self) -> str:
        return f"{self.kind.label} {self.name}"


@dataclass(frozen=True)
class MachineFacts:
    """The machine as the planner sees it now.

    ``vram_free``: what the host counts as free on the onload device (None: the onload device
    is the CPU: nothing is pinned and nothing stays on a GPU). ``ram_available``: RAM this
    process can still take (the lower of the system's "available" and its memory cgroup's).
    ``pin_limit``: bytes that may be page-locked (None: no limit known). ``disk_free``: free
    bytes in the disk folder (None: no usable folder). ``ram_budget`` / ``vram_budget``: the
    user's caps, if set (settings file, the sidebar, the panel).
    """

    vram_free: int | None
    ram_available: int
    pin_limit: int | None = None
    disk_free: int | None = None
    disk_folder: str | None = None
    disk_gbps: float = ASSUMED_DISK_GBPS
    disk_measured: bool = False
    #: The disk figure came from the planner's own probe (disk/speed_probe.py), not from a prompt.
    disk_probed: bool = False
    #: Where the disk figure is assumed: why nothing measured it (a probe that failed).
    disk_why_assumed: str | None = None
    ram_headroom: int = DEFAULT_RAM_HEADROOM
    vram_headroom: int = 2 * GIB
    ram_budget: int | None = None
    vram_budget: int | None = None
    copy_gbps: float | None = None  # pinned H2D (GPU) or RAM copy (CPU); None: assumed
    compute_gbps: float | None = None  # None: assumed for the device

    @property
    def on_gpu(self) -> bool:
        return self.vram_free is not None

    def tier_gbps(self, tier: TierName) -> float:
        """How fast a group arrives from ``tier``."""
        if tier == "disk":
            return self.disk_gbps
        if not self.on_gpu:
            return self.copy_gbps or ASSUMED_CPU_COPY_GBPS
        if tier in ("pinned", "shared"):  # a shared segment is registered for pinned copies
            return self.copy_gbps or ASSUMED_PINNED_GBPS
        return (self.copy_gbps or ASSUMED_PINNED_GBPS) * ASSUMED_RAM_GBPS / ASSUMED_PINNED_GBPS

    def tier_measured(self, tier: TierName) -> bool:
        return self.disk_measured if tier == "disk" else self.copy_gbps is not None

    def tier_said(self, tier: TierName) -> str:
        """How the tier's speed is known, said after it: nothing for a prompt's measure,
        "(probed)", or "(assumed)" with why nothing measured it where a probe failed."""
        if tier == "disk" and self.disk_probed:
            return " (probed)"
        if self.tier_measured(tier):
            return ""
        why = self.disk_why_assumed if tier == "disk" else None
        return f" (assumed; {why})" if why else " (assumed)"

    @property
    def device_gbps(self) -> float:
        if self.compute_gbps:
            return self.compute_gbps
        return ASSUMED_GPU_COMPUTE_GBPS if self.on_gpu else ASSUMED_CPU_COMPUTE_GBPS

    @property
    def vram_for_ferry(self) -> int | None:
        """VRAM a network may use while it runs. On a CPU: the user's budget for what stays
        on the onload device (None: none, everything streams), as model/plan.py reads it."""
        if self.vram_free is None:
            return self.vram_budget
        free = max(0, self.vram_free - self.vram_headroom)
        return free if self.vram_budget is None else min(free, self.vram_budget)
