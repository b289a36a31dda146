"""Forge's UNet weights that are views of the checkpoint file, put back as such on release.

Forge's loader maps a safetensors checkpoint and its Linear layers take the file's tensor as
it is when the dtype matches (``Parameter(t.to(dummy))`` is ``t``): those weights are pages of
the file's cache, which the kernel can reclaim, not process memory. Ferry's ``remove()`` puts
every weight back as a fresh tensor, so switching Ferry off would leave them as anonymous copies
(0.8 GiB more process memory on an SD 1.5 UNet, measured). So the layout keeps the views it
found (no memory: the mapping is Forge's) and, after ``remove()``, points each parameter back at
its view where the bytes are still the same: Forge gets back the network it had.

Linux only (it reads /proc/self/maps); elsewhere nothing is kept and the copies stay.
"""

from __future__ import annotations

import bisect

import torch
from torch import nn

from ..offload_core.disk.maps import file_mappings


def _file_ranges() -> list[tuple[int, int]]:
    """The address ranges of this process mapped from files (sorted; deleted files count:
    their pages are still the mapping's)."""
    return [(m.lo, m.hi) for m in file_mappings()]


def _inside(ranges: list[tuple[int, int]], t: torch.Tensor) -> bool:
    start = t.data_ptr()
    end = start + t.numel() * t.element_size()
    i = bisect.bisect_right(ranges, (start, float("inf"))) - 1
    return i >= 0 and ranges[i][0] <= start and end <= ranges[i][1]


def file_views(module: nn.Module) -> dict[str, torch.Tensor]:
    """{parameter name: its tensor} for the CPU parameters that are views of a mapped file."""
    params = [(n, p) for n, p in module.named_parameters() if p.device.type == "cpu"]
    if not params:
        return {}
    ranges = _file_ranges()
    if not ranges:
        return {}
    return {
        n: p.detach()
        for n, p in params
        if type(p) is nn.Parameter and p.numel() and _inside(ranges, p.detach())
    }


def put_back(module: nn.Module, views: dict[str, torch.Tensor]) -> int:
    """Points each parameter at its kept view where its bytes are the view's; returns how many."""
    by_name = dict(module.named_parameters())
    n = 0
    for name, view in views.items():
        p = by_name.get(name)
        if (
            p is not None
            and p.device == view.device
            and p.dtype == view.dtype
            and p.shape == view.shape
            and torch.equal(p.detach(), view)
        ):
            p.data = view
            n += 1
    return n
