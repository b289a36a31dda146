"""What the pre-flight's picture draws (the sidebar's bars per network): where each network's
bytes wait while a prompt runs, and the machine's room they are set against. Figures the
plan already has, regrouped: nothing here decides anything.

Where a network waits:
  ``vram``: what it takes on the GPU while it runs: its resident share, its streaming slots
    and a quantized layer's dequantized copy (the plan's peak VRAM counts the same); None
    where the onload device is the CPU (there is no VRAM to draw);
  ``ram``: its host tier and working RAM (the plan's RAM peak counts the same);
  ``disk``: its bytes on the disk tier, read from there each prompt (0 on another tier).
The room: the free VRAM as the host counts it (None on a CPU), the RAM Ferry may take (after
the headroom, under a RAM budget) and the disk folder's free bytes (None: no folder).
"""

from __future__ import annotations

from ..policy import TierName
from .facts import MachineFacts


def where_waits(
    *, on_gpu: bool, tier: TierName, nbytes: int, vram_resident: int, slot_bytes: int,
    transient_bytes: int, ferry: bool, ram_bytes: int,
) -> dict[str, int | None]:  # fmt: skip
    """A network's bytes by where they wait, from its choice's figures (choose.py's Choice:
    passed as numbers, so this module does not import the planner that imports it)."""
    vram = vram_resident + slot_bytes + (transient_bytes if ferry else 0)
    return {
        "vram": vram if on_gpu else None,
        "ram": ram_bytes,
        "disk": nbytes if tier == "disk" else 0,
    }


def machine_room(machine: MachineFacts, ram_room: int) -> dict[str, int | None]:
    return {"vram": machine.vram_free, "ram": ram_room, "disk": machine.disk_free}
