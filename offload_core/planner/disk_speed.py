"""The disk folder's read speed, as Ferry measured it reading group files there.

Measured once and kept: after a prompt, a host records the disk tier's measured GB/s
(``record``: the stats' ``disk_gbps``) in a small file inside the folder, so the figure
travels with the disk it describes. Until a figure is recorded the planner assumes a
conservative one (facts.ASSUMED_DISK_GBPS) and says "assumed" in its sentences.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..disk.durable import atomic_write
from .facts import ASSUMED_DISK_GBPS

FILE = ".ferry-disk-speed.json"


def cached(folder: str | None) -> tuple[float, bool]:
    """(GB/s, measured): the recorded figure, or the assumed one where none is."""
    if not folder:
        return ASSUMED_DISK_GBPS, False
    try:
        value = json.loads((Path(folder).expanduser() / FILE).read_text(encoding="utf-8"))
        gbps = float(value["read_gbps"])
    except (OSError, ValueError, KeyError, TypeError):
        return ASSUMED_DISK_GBPS, False
    if not math.isfinite(gbps) or gbps <= 0:
        return ASSUMED_DISK_GBPS, False
    return gbps, True


def record(folder: str, gbps: float) -> bool:
    """Keeps ``gbps`` as the folder's read speed; False where the folder cannot take it (the
    next plan assumes a figure again: never an error, the speed is advice)."""
    if not math.isfinite(gbps) or gbps <= 0:
        return False
    root = Path(folder).expanduser()
    try:
        if not root.is_dir():
            return False
        with atomic_write(root / FILE, mode=0o644) as f:
            f.write(json.dumps({"read_gbps": round(gbps, 3)}).encode("utf-8"))
    except OSError:
        return False
    return True
