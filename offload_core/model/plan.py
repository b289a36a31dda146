"""Deciding, before anything moves, which groups stream and which stay on the device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import AlreadyOffloadedError, ConfigError
from ..policy import AUTO, DiskTier, OffloadPolicy, RamTier
from ..units import fmt_bytes
from .grouping import Grouping, build_grouping
from .layout import module_nbytes


@dataclass(frozen=True)
class GroupPlan:
    name: str
    nbytes: int
    resident: bool


@dataclass
class OffloadPlan:
    """What apply_offload will do. ``describe()`` prints it as a table."""

    policy: OffloadPolicy
    device: torch.device
    groups: list[GroupPlan]
    prefetch_depth: int
    slot_bytes: int  # one device slot (the largest streamed group)
    outside_bytes: int  # weights outside the groups, always on the device
    budget_bytes: int | None
    max_blocks_per_group: int
    grouping: Grouping
    notes: list[str]

    @property
    def streamed(self) -> list[GroupPlan]:
        return [g for g in self.groups if not g.resident]

    @property
    def n_slots(self) -> int:
        return self.prefetch_depth + 1 if self.streamed else 0

    @property
    def device_bytes(self) -> int:
        """Weights on the device at peak: outside + resident groups + the streaming slots."""
        resident = sum(g.nbytes for g in self.groups if g.resident)
        return self.outside_bytes + resident + self.n_slots * self.slot_bytes

    @property
    def offloaded_bytes(self) -> int:
        return sum(g.nbytes for g in self.streamed)

    def bytes_per_tier(self) -> dict[str, int]:
        tier = self.policy.tier_name
        out = {"device": self.device_bytes, "pinned": 0, "ram": 0, "shared": 0, "disk": 0}
        if tier == "pinned" and self.device.type == "cpu":
            tier = "ram"  # nothing to pin for on a CPU
        out[tier] += self.offloaded_bytes
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy.to_dict(),
            "device": str(self.device),
            "groups": [g.__dict__ for g in self.groups],
            "prefetch_depth": self.prefetch_depth,
            "slots": self.n_slots,
            "slot_bytes": self.slot_bytes,
            "outside_bytes": self.outside_bytes,
            "device_bytes": self.device_bytes,
            "budget_bytes": self.budget_bytes,
            "bytes_per_tier": self.bytes_per_tier(),
            "max_blocks_per_group": self.max_blocks_per_group,
            "notes": list(self.notes),
        }

    def describe(self) -> str:
        p = self.policy
        lines = [
            f"Ferry plan: {p.level_name} level"
            + (
                f", {p.to_dict()['blocks_per_group']} block(s)/group"
                if p.level_name == "block"
                else ""
            )
            + f", tier {p.tier_name}, onload {self.device}, prefetch depth {self.prefetch_depth}",
            f"  groups: {len(self.groups)} ({len(self.streamed)} streamed, "
            f"{len(self.groups) - len(self.streamed)} resident); "
            f"slots: {self.n_slots} x {fmt_bytes(self.slot_bytes)}",
            f"  device weights at peak: {fmt_bytes(self.device_bytes)} "
            f"(outside groups {fmt_bytes(self.outside_bytes)})"
            + (f" of budget {fmt_bytes(self.budget_bytes)}" if self.budget_bytes else ""),
            "  offloaded: "
            + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in self.bytes_per_tier().items() if v),
        ]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def resolve_device(onload_device: str | torch.device | None) -> torch.device:
    if onload_device is None:
        acc = torch.accelerator.current_accelerator() if hasattr(torch, "accelerator") else None
        return torch.device(acc.type) if acc is not None else torch.device("cpu")
    try:
        dev = torch.device(onload_device)
    except (RuntimeError, TypeError):
        raise ConfigError(
            "onload_device", f"{onload_device!r} is not a device; use 'cuda', 'cpu', ..."
        ) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "onload_device", "CUDA was asked for but no CUDA device is available; use 'cpu'"
        )
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ConfigError(
            "onload_device", f"{dev} does not exist ({torch.cuda.device_count()} CUDA devices)"
        )
    return dev


def plan_offload(
    model: nn.Module,
    policy: OffloadPolicy | None = None,
    *,
    onload_device: str | torch.device | None = None,
) -> OffloadPlan:
    """Validates everything apply_offload would check and returns its decision. Moves nothing."""
    policy = policy or OffloadPolicy()
    policy.validate()
    if getattr(model, "_ferry_offload", None) is not None:
        raise AlreadyOffloadedError(
            f"{type(model).__name__} already has a Ferry offload; call handle.remove() "
            "(or offload_core.find_offload(model).remove()) before applying another"
        )
    device = resolve_device(onload_device)
    grouping = build_grouping(model, policy.level)
    notes = _tier_notes(policy, device)
    sizes = [g.nbytes for g in grouping.groups]
    depth = min(policy.prefetch_depth, max(len(sizes) - 1, 1))
    resident = [False] * len(sizes)
    budget = _budget(policy, device, module_nbytes(model, on=device))
    if budget is not None:
        resident, depth = _fit_budget(budget, grouping, depth, notes)
        if depth < policy.prefetch_depth and not all(resident):
            notes.append(f"prefetch depth lowered to {depth} to fit the budget")
    groups = [GroupPlan(g.name, g.nbytes, r) for g, r in zip(grouping.groups, resident)]
    return OffloadPlan(
        policy=policy,
        device=device,
        groups=groups,
        prefetch_depth=depth,
        slot_bytes=max((g.nbytes for g in groups if not g.resident), default=0),
        outside_bytes=grouping.resident_bytes,
        budget_bytes=budget,
        max_blocks_per_group=max(grouping.longest_block_list, 1),
        grouping=grouping,
        notes=notes,
    )


def _tier_notes(policy: OffloadPolicy, device: torch.device) -> list[str]:
    """Checks the tier against this machine; returns the plan's notes about it."""
    notes: list[str] = []
    if isinstance(policy.tier, DiskTier) and policy.tier.source_checkpoint:
        from pathlib import Path

        if not Path(policy.tier.source_checkpoint).is_file():
            raise ConfigError("source_checkpoint", f"{policy.tier.source_checkpoint} is not a file")
    if policy.tier_name == "pinned" and device.type == "cpu":
        notes.append("onload device is the CPU: pinned RAM behaves as plain RAM")
    if isinstance(policy.tier, RamTier) and device.type != "cpu":
        notes.append("plain RAM: host-to-device copies are slower than from pinned RAM")
    return notes


def _fit_budget(
    budget: int, grouping: Grouping, depth: int, notes: list[str]
) -> tuple[list[bool], int]:
    """Which groups stay resident under ``budget``, and the prefetch depth that fits beside
    them (lowered if the slots alone do not fit). Raises if streaming itself does not fit."""
    sizes = [g.nbytes for g in grouping.groups]
    slot = max(sizes, default=0)
    if budget >= grouping.resident_bytes + sum(sizes):
        notes.append("the whole model fits the budget: nothing streams")
        return [True] * len(sizes), depth
    while depth > 1 and grouping.resident_bytes + (depth + 1) * slot > budget:
        depth -= 1
    need = grouping.resident_bytes + (depth + 1) * slot
    if need > budget:
        raise ConfigError(
            "vram_budget",
            f"{fmt_bytes(budget)} is less than the {fmt_bytes(need)} streaming needs "
            f"(weights outside the blocks {fmt_bytes(grouping.resident_bytes)} + 2 slots "
            f"of {fmt_bytes(slot)}); lower blocks_per_group, use level='leaf', or raise "
            "vram_budget",
        )
    k = min(len(sizes), (budget - need) // slot) if slot else 0
    if k >= len(sizes) - 1:
        k = len(sizes) - 1  # keep one streaming so the slots are not wasted
    resident = [False] * len(sizes)
    # Evenly spaced resident groups give each streamed group more compute to hide behind.
    for i in range(int(k)):
        resident[(i * len(sizes)) // int(k)] = True
    return resident, depth


def _budget(policy: OffloadPolicy, device: torch.device, on_device: int) -> int | None:
    b = policy.vram_budget
    if b is None:
        return None
    if b == AUTO:
        if device.type != "cuda":
            return None
        # The model's own bytes already on the device count as available: they move off.
        free, _total = torch.cuda.mem_get_info(device)
        room = max(int(free) + on_device - policy.headroom_bytes, 0)
        # The planner's share (planner/apply.py with_choice), where it gave one; capped by room.
        return room if policy.planned_vram is None else min(room, policy.planned_vram)
    return int(b)
