"""This machine's figures for the planner, read now: the RAM the process can still take
(the system's and its memory cgroup's, runtime/memory.py), the pin limit, the disk folder's
free space and read speed. VRAM is the host's to give (ComfyUI counts what its own models
could free): ``vram_free`` is passed in, None on a CPU."""

from __future__ import annotations

import sys

import psutil

from ..disk.folder import check_disk_folder
from ..runtime.memory import system_available_ram
from ..units import GIB
from . import disk_speed
from .facts import DEFAULT_RAM_HEADROOM, MachineFacts


def default_pin_limit(total_ram: int, platform: str = sys.platform) -> int:
    """What may be page-locked where the host sets no limit, as ComfyUI core sets its
    ``MAX_PINNED_MEMORY``: Windows refuses to pin much past half of RAM (core takes 40 %);
    elsewhere 90 % of RAM, keeping 4 GiB, but never under 40 %."""
    if platform == "win32":
        return int(total_ram * 0.40)
    return int(max(total_ram * 0.40, min(total_ram * 0.90, total_ram - 4 * GIB)))


def default_ram_headroom(available: int) -> int:
    """RAM kept free beside what Ferry plans: an eighth of what is available, between
    512 MiB (the host's own work on a small machine or container) and 2 GiB."""
    return max(512 << 20, min(DEFAULT_RAM_HEADROOM, available // 8))


def read_machine(
    *,
    vram_free: int | None,
    disk_folder: str | None = None,
    pin_limit: int | None = None,
    ram_budget: int | None = None,
    vram_budget: int | None = None,
    ram_headroom: int | None = None,
    probe: bool = False,
) -> MachineFacts:
    """The machine now. ``pin_limit``: the host's (ComfyUI: ``MAX_PINNED_MEMORY``; 0 where
    it pins nothing), else ``default_pin_limit``. A disk folder that cannot be used counts as
    none (its check's message is the folder widget's, not the planner's). ``probe``: measure
    the disk folder's read speed where nothing has (disk_speed.py; a host's plan of a prompt
    does, a panel's plan as a user types a folder does not)."""
    free = None
    if disk_folder:
        check = check_disk_folder(disk_folder)
        free = check.free_bytes if check.ok else None
    speed = disk_speed.ASSUMED
    if disk_folder and free is not None:
        speed = disk_speed.for_plan(disk_folder, probe=probe)
    if pin_limit is None and vram_free is not None:
        pin_limit = default_pin_limit(int(psutil.virtual_memory().total))
    available = system_available_ram()
    return MachineFacts(
        vram_free=vram_free,
        ram_available=available,
        pin_limit=pin_limit,
        disk_free=free,
        disk_folder=disk_folder,
        disk_gbps=speed.gbps,
        disk_measured=speed.measured,
        disk_probed=speed.source == "probe",
        disk_why_assumed=speed.why,
        ram_headroom=default_ram_headroom(available) if ram_headroom is None else ram_headroom,
        ram_budget=ram_budget,
        vram_budget=vram_budget,
    )
