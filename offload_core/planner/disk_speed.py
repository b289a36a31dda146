"""The disk folder's read speed: measured, kept, and said for what it is.

Two measurements, kept in one small file inside the folder (``FILE``), so the figure travels
with the disk it describes, and tagged with the folder's device (``st_dev``): a figure kept
for another device (the folder now a mount point, a copied folder) is not this one's.
- ``record``: after a prompt, a host records the disk tier's measured GB/s (the stats'
  ``disk_gbps``: Ferry reading its own group files there). This one wins.
- ``probe``: the first time a folder is planned with nothing recorded, a short bounded probe
  (offload_core/disk/speed_probe.py) measures it; kept, so later plans never probe again. A process also keeps
  each device's figure, so a second folder on the same disk is not probed.
Until either is there the planner assumes a conservative figure (facts.ASSUMED_DISK_GBPS) and
says "assumed" in its sentences, with why nothing measured it where a probe failed.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..disk import speed_probe
from ..disk.durable import atomic_write
from .facts import ASSUMED_DISK_GBPS

FILE = ".ferry-disk-speed.json"
Source = Literal["prompt", "probe", "assumed"]


@dataclass(frozen=True)
class DiskSpeed:
    gbps: float
    source: Source
    why: str | None = None  # where assumed: why nothing measured it (None: nothing tried)

    @property
    def measured(self) -> bool:
        return self.source != "assumed"


ASSUMED = DiskSpeed(ASSUMED_DISK_GBPS, "assumed")
#: st_dev -> the figure a probe or a prompt measured for that device, in this process.
_by_device: dict[int, DiskSpeed] = {}


def _device(root: Path) -> int | None:
    """The device ``root`` is on (a folder not made yet: the one it would be made on)."""
    p = root
    while not p.exists() and p.parent != p:
        p = p.parent
    try:
        return os.stat(p).st_dev
    except OSError:
        return None


def _kept(root: Path) -> dict[str, Any]:
    """The folder's kept figures, where they are this device's (an unreadable or another
    device's file: none)."""
    try:
        value = json.loads((root / FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(value, dict):
        return {}
    if "device" in value and value["device"] != _device(root):
        return {}
    return value


def _figure(value: Any) -> float | None:
    try:
        gbps = float(value)
    except (TypeError, ValueError):
        return None
    return gbps if math.isfinite(gbps) and gbps > 0 else None


def known(folder: str | None) -> DiskSpeed:
    """The folder's kept figure: a prompt's, else a probe's, else the assumed one."""
    if not folder:
        return ASSUMED
    kept = _kept(Path(folder).expanduser())
    for key, source in (("read_gbps", "prompt"), ("probe_gbps", "probe")):
        gbps = _figure(kept.get(key))
        if gbps is not None:
            return DiskSpeed(gbps, source)  # type: ignore[arg-type]
    return ASSUMED


def cached(folder: str | None) -> tuple[float, bool]:
    """(GB/s, measured): the kept figure, or the assumed one where none is."""
    speed = known(folder)
    return speed.gbps, speed.measured


def _keep(root: Path, **figures: float) -> bool:
    kept = {**_kept(root), **{k: round(v, 3) for k, v in figures.items()}}
    kept["device"] = _device(root)
    try:
        if not root.is_dir():
            return False
        with atomic_write(root / FILE, mode=0o644) as f:
            f.write(json.dumps(kept).encode("utf-8"))
    except OSError:
        return False
    return True


def record(folder: str, gbps: float) -> bool:
    """Keeps ``gbps``, measured by a prompt, as the folder's read speed; False where the
    folder cannot take it (the next plan assumes or probes again: never an error, the speed
    is advice)."""
    if _figure(gbps) is None:
        return False
    root = Path(folder).expanduser()
    device = _device(root)
    if device is not None:
        _by_device[device] = DiskSpeed(gbps, "prompt")
    return _keep(root, read_gbps=gbps)


def for_plan(folder: str, *, probe: bool = True) -> DiskSpeed:
    """The figure a plan uses for ``folder``: the kept one; else this device's from another
    folder in this process; else (``probe``) a probe's, kept; else the assumed one, with
    why the probe measured nothing."""
    speed = known(folder)
    root = Path(folder).expanduser()
    device = _device(root)
    if speed.measured and device is not None:
        _by_device.setdefault(device, speed)
    if speed.measured or not probe:
        return speed
    if device is not None and device in _by_device:
        seen = _by_device[device]
        _keep(root, **{"read_gbps" if seen.source == "prompt" else "probe_gbps": seen.gbps})
        return seen
    found = speed_probe.probe(root)
    if found.gbps is None:
        return DiskSpeed(ASSUMED_DISK_GBPS, "assumed", found.why)
    speed = DiskSpeed(found.gbps, "probe")
    if device is not None:
        _by_device[device] = speed
    _keep(root, probe_gbps=found.gbps, probe_bytes=found.bytes_read)
    return speed
