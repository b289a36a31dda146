"""The planner's choice for the panel's test model on this machine: what Ferry would choose
without measuring, shown beside the planner tab's measured table (the same planner the
ComfyUI nodes use for "auto", offload_core/planner)."""

from __future__ import annotations

import torch

from ..model.demo import demo_on_meta
from ..offload_kind import OffloadKind
from ..planner import GraphPlan, plan_graph
from ..planner.machine import read_machine
from ..planner.network_module import network_from_module
from ..runtime.memory import device_memory


def free_vram(onload_device: str | None) -> int | None:
    """Free VRAM on ``onload_device`` where the driver tells (None: a CPU, or not known)."""
    mem = device_memory(onload_device) if onload_device else None
    if mem is None or mem.device_total is None or mem.device_used is None:
        return None
    return mem.device_total - mem.device_used


def plan_test_model(
    size_gb: float,
    *,
    onload_device: str | None,
    disk_path: str | None,
    vram_budget: int | None,
    ram_budget: int | None,
    dtype: torch.dtype = torch.float32,
) -> GraphPlan:
    """The plan of the demo model of ``size_gb`` (GiB, as the planner tab builds it)."""
    net = network_from_module(demo_on_meta(size_gb, dtype), "test model", OffloadKind.MODEL)
    machine = read_machine(
        vram_free=free_vram(onload_device),
        disk_folder=disk_path,
        vram_budget=vram_budget,
        ram_budget=ram_budget,
    )
    return plan_graph(machine, [net])
