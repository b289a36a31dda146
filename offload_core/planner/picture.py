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

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .choose import Choice, GraphPlan


def where_waits(c: Choice, on_gpu: bool) -> dict[str, int | None]:
    n = c.network
    vram = c.vram_resident + c.sizing.slot_bytes + (n.transient_bytes if n.ferry else 0)
    return {
        "vram": vram if on_gpu else None,
        "ram": c.ram_bytes,
        "disk": n.nbytes if c.tier == "disk" else 0,
    }


def machine_room(plan: GraphPlan) -> dict[str, int | None]:
    m = plan.machine
    return {"vram": m.vram_free, "ram": plan.ram_room, "disk": m.disk_free}
