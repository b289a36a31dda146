"""Every way the benchmark runs one model, each applied to a freshly loaded model in its own
subprocess: resident, Ferry (each tier and level), diffusers group offloading, accelerate.

Each mode returns a ``Applied`` whose ``files`` are what its forwards read from disk (their
page cache is dropped before every timed forward) and whose ``stats`` reads Ferry's counters.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from offload_core.units import GB

FERRY_LEVELS = ("block", "leaf")
FERRY_TIERS = ("pinned", "ram", "disk")


@dataclass
class Applied:
    files: list[Path] = field(default_factory=list)
    stats: Callable[[], dict[str, Any]] | None = None
    notes: list[str] = field(default_factory=list)
    cleanup: Callable[[], None] | None = None


def all_modes() -> list[str]:
    ferry = [f"ferry-{lv}-{t}" for lv in FERRY_LEVELS for t in FERRY_TIERS]
    ferry.append("ferry-block-disk-ckpt")
    peers = [
        "diffusers-block",
        "diffusers-block-disk",
        "diffusers-leaf",
        "diffusers-leaf-disk",
        "accelerate-cpu",
        "accelerate-disk",
    ]
    return ["resident", *ferry, *peers]


def base_mode(mode: str) -> str:
    """``ferry-block-disk+copy+t1`` -> ``ferry-block-disk``. Suffixes (Ferry only): ``+p<N>``
    prefetch depth N; ``+copy`` DiskTier(cpu_read="copy") (read into slots, not mapped);
    ``+mapped`` DiskTier(cpu_read="mapped") (without either, the default "auto" decides);
    ``+everycrc`` DiskTier(verify="every_read"); ``+buffered`` DiskTier(direct_io=False);
    ``+t<N>`` ``apply_offload(read_threads=N)``: the disk reader's pool; ``+portable`` the
    disk tier reads through the portable backend (disk/portable.py: Windows' way, no
    ``os.preadv``), chosen at apply as a platform without it would; ``+pageable`` the RAM
    tier copies each group straight from pageable memory, not through the pinned staging ring
    (as before issue 41: [Note: the RAM tier through staging])."""
    return mode.split("+", 1)[0]


def is_disk(mode: str) -> bool:
    m = base_mode(mode)
    return m.endswith("-disk") or m.endswith("-disk-ckpt")


def valid(mode: str) -> bool:
    if base_mode(mode) not in all_modes():
        return False
    extras = mode.split("+")[1:]
    return not extras or (
        mode.startswith("ferry-")
        and all(
            e in ("copy", "mapped", "everycrc", "buffered", "portable", "pageable")
            or (e[:1] in "tp" and e[1:].isdigit())
            for e in extras
        )
    )


def peer_available(mode: str) -> str | None:
    """None if the mode can run here, else why not."""
    import importlib.util

    for pkg in ("diffusers", "accelerate"):
        if mode.startswith(pkg) and importlib.util.find_spec(pkg) is None:
            return f"{pkg} is not installed (bash bench/run.sh installs it)"
    return None


def apply_mode(
    mode: str,
    model: nn.Module,
    device: torch.device,
    workdir: Path,
    checkpoint: Path,
    opts: dict[str, Any],
) -> Applied:
    if mode == "resident":
        model.to(device)
        return Applied()
    if mode.startswith("ferry-"):
        return _ferry(mode, model, device, workdir, checkpoint, opts)
    if mode.startswith("diffusers-"):
        return _diffusers(mode, model, device, workdir, opts.get("blocks_per_group", 1))
    if mode.startswith("accelerate-"):
        return _accelerate(mode, model, device, workdir)
    raise ValueError(f"unknown mode {mode!r}")


def _ferry(
    mode: str,
    model: nn.Module,
    device: torch.device,
    workdir: Path,
    checkpoint: Path,
    opts: dict[str, Any],
) -> Applied:
    from offload_core import (
        BlockLevel,
        DiskTier,
        LeafLevel,
        OffloadPolicy,
        PinnedRamTier,
        RamTier,
        apply_offload,
    )
    from offload_core.disk.files import files, using
    from offload_core.disk.portable import PortableFiles

    parts = base_mode(mode).split("-")
    extras = mode.split("+")[1:]
    prefetch = opts.get("prefetch", 1)
    read_threads = 4
    for e in extras:
        if e[:1] == "p" and e[1:].isdigit():
            prefetch = int(e[1:])
        elif e.startswith("t"):
            read_threads = int(e[1:])
    level = BlockLevel(opts.get("blocks_per_group", 1)) if parts[1] == "block" else LeafLevel()
    ckpt = base_mode(mode).endswith("-ckpt")
    tier: Any = {"pinned": PinnedRamTier(), "ram": RamTier()}.get(parts[2])
    if tier is None:
        tier = DiskTier(
            str(workdir / "ferry"),
            source_checkpoint=str(checkpoint) if ckpt else None,
            direct_io="buffered" not in extras,
            verify="every_read" if "everycrc" in extras else "first_read",
            cpu_read=next((e for e in extras if e in ("copy", "mapped")), "auto"),
        )
    policy = OffloadPolicy(level=level, tier=tier, prefetch_depth=prefetch)
    with using(PortableFiles() if "portable" in extras else files()):
        handle = apply_offload(
            model, policy, onload_device=device, name="bench", read_threads=read_threads
        )
    if "pageable" in extras and handle._engine is not None:
        transfers = handle._engine.transfers  # no staging ring: the direct copy
        for st in transfers.stagings:
            transfers.backend.release_host(st.buf)
        transfers.stagings = []

    def stats() -> dict[str, Any]:
        s = handle.stats()
        return {
            "bytes_h2d": s.bytes_h2d,
            "bytes_disk": s.bytes_disk,
            "disk_s": s.bytes_disk / (s.disk_gbps * GB) if s.disk_gbps else 0.0,
            "h2d_s": s.bytes_h2d / (s.h2d_gbps * GB) if s.h2d_gbps else 0.0,
            "stall_s": s.stall_s,
            "transfer_s": s.transfer_s,
            "group_loads": s.group_loads,
            "on_demand_loads": s.on_demand_loads,
            "groups": s.groups,
            "prefetch_depth": s.prefetch_depth,
        }

    files = []
    if isinstance(tier, DiskTier):
        folder = handle.stats().disk_folder
        files = [Path(folder)] if folder else []
        if ckpt:
            files.append(checkpoint)
    return Applied(
        files=files, stats=stats, notes=list(handle.stats().notes), cleanup=handle.remove
    )


def _diffusers(
    mode: str, model: nn.Module, device: torch.device, workdir: Path, blocks_per_group: int
) -> Applied:
    from diffusers.hooks import apply_group_offloading

    level = "block_level" if "-block" in mode else "leaf_level"
    disk = mode.endswith("-disk")
    folder = workdir / "diffusers"
    use_stream = device.type == "cuda"
    apply_group_offloading(
        model,
        onload_device=device,
        offload_device=torch.device("cpu"),
        offload_type=level,
        num_blocks_per_group=blocks_per_group if level == "block_level" else None,
        use_stream=use_stream,
        record_stream=use_stream,
        non_blocking=use_stream,
        offload_to_disk_path=str(folder) if disk else None,
    )
    notes = [f"use_stream={use_stream}"]
    return Applied(files=[folder] if disk else [], notes=notes)


def _accelerate(mode: str, model: nn.Module, device: torch.device, workdir: Path) -> Applied:
    from accelerate import cpu_offload, disk_offload

    if mode == "accelerate-cpu":
        cpu_offload(model, execution_device=device)
        return Applied()
    folder = workdir / "accelerate"
    disk_offload(model, offload_dir=str(folder), execution_device=device)
    return Applied(files=[folder], cleanup=lambda: shutil.rmtree(folder, ignore_errors=True))
