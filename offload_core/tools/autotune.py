"""The planner: "find settings for this machine".

Nobody can say from a spec sheet how many blocks per group a given GPU, bus and disk want.
So the planner measures: it runs a model (the built-in demo model, or one a factory builds)
under a handful of candidate policies, and for each records the time per forward, the peak
VRAM and the peak RAM. It recommends the FASTEST plan that fits the budgets it was given;
when nothing fits it says which budget to raise.

Every candidate is planned with ``plan_offload`` (nothing moves) before the first forward,
so a bad disk path or an impossible grouping fails before minutes of work.

    python -m offload_core.tools.autotune --size-gb 0.05 --vram-budget-gb 4 --ram-budget-gb 16

Peak VRAM is measured where the device reports it; on a CPU-only machine there is no VRAM,
so the column shows what the plan would keep on the device (marked "planned").
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import ConfigError
from ..model.plan import plan_offload
from ..policy import (
    AUTO,
    BlockLevel,
    DiskTier,
    OffloadPolicy,
    RamTier,
    Tier,
    parse_gib,
    parse_vram_budget,
)
from ..units import GIB, fmt_bytes
from .measure import measure_policy

#: Builds a fresh model and the keyword inputs of one forward: ``model(**inputs)``.
ModelFactory = Callable[[], tuple[torch.nn.Module, dict[str, Any]]]
_RAM_HELP = "type a number of GiB above 0 (e.g. 16), or leave it empty for no limit"
#: ``progress(done, total, what)`` after each step; bind a progress bar to it.
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class Budget:
    """What the plan may use; None means no limit on that resource."""

    vram_bytes: int | None = None
    ram_bytes: int | None = None

    def validate(self) -> None:
        for name, v in (("vram_budget_gb", self.vram_bytes), ("ram_budget_gb", self.ram_bytes)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
                raise ConfigError(name, f"must be a positive amount of memory or empty, got {v!r}")

    @classmethod
    def from_gb(cls, vram_gb: Any, ram_gb: Any) -> Budget:
        """The budgets as a user, a widget or the command line gives them, through the one
        parser of each (policy.py): "6", 6 and 6.0 are 6 GiB, empty and 0 no limit."""
        vram = parse_vram_budget(vram_gb)
        if vram == AUTO:
            raise ConfigError(
                "vram_budget_gb", "the planner measures against a number of GiB; type one "
                "(e.g. 6) or leave it empty for no limit"
            )  # fmt: skip
        return cls(vram, parse_gib("ram_budget_gb", ram_gb, _RAM_HELP))


@dataclass(frozen=True)
class TuneRow:
    """One candidate's measurement. ``error`` is set when it could not run (e.g. out of memory)."""

    index: int
    label: str
    policy: OffloadPolicy
    seconds_per_forward: float | None
    peak_vram: int | None  # bytes
    vram_measured: bool  # False: the plan's device bytes (no accelerator reports memory)
    peak_ram: int | None  # bytes: peak RssAnon + RssShmem (file-backed cache is reclaimable)
    peak_ram_file: int | None  # bytes: peak RssFile, shown apart (page cache of group files)
    fits: bool
    error: str | None = None

    def as_record(self) -> dict[str, Any]:
        gb = _gb
        return {
            "#": self.index,
            "plan": self.label,
            "s/forward": None
            if self.seconds_per_forward is None
            else round(self.seconds_per_forward, 4),
            "peak VRAM GiB": gb(self.peak_vram),
            "peak RAM GiB": gb(self.peak_ram),
            "fits": "yes" if self.fits else "no",
            "note": self.error or ("" if self.vram_measured else "VRAM planned (no accelerator)"),
        }


@dataclass(frozen=True)
class TuneResult:
    rows: list[TuneRow]
    budget: Budget
    device: str
    recommended: TuneRow | None
    reason: str
    extra: dict[str, Any] = field(default_factory=dict)

    def table(self) -> str:
        """A markdown table, one line per candidate, then the recommendation."""
        cols = ["#", "plan", "s/forward", "peak VRAM GiB", "peak RAM GiB", "fits", "note"]
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for r in self.rows:
            rec = r.as_record()
            lines.append("| " + " | ".join(_cell(rec[c]) for c in cols) + " |")
        return "\n".join(lines)

    def summary(self) -> str:
        b = self.budget
        head = (
            f"device: {self.device}; budget: VRAM {_budget_text(b.vram_bytes)}, "
            f"RAM {_budget_text(b.ram_bytes)}"
        )
        return f"{head}\n\n{self.table()}\n\n{self.reason}"


def _gb(n: int | None) -> float | None:
    return None if n is None else round(n / GIB, 4)


def _cell(v: Any) -> str:
    return "-" if v is None or v == "" else str(v)


def _budget_text(n: int | None) -> str:
    return "no limit" if n is None else fmt_bytes(n)


def describe_policy(p: OffloadPolicy) -> str:
    level = f"block x{p.level.blocks_per_group}" if isinstance(p.level, BlockLevel) else "leaf"
    budget = (
        "" if p.vram_budget is None else f", keep resident up to {_budget_text_any(p.vram_budget)}"
    )
    return f"{level}, {p.tier_name}, prefetch {p.prefetch_depth}{budget}"


def _budget_text_any(b: Any) -> str:
    return "auto" if b == "auto" else _budget_text(int(b))


def demo_factory(
    size_gb: float = 0.05, tokens: int = 64, dtype: torch.dtype = torch.float32
) -> ModelFactory:
    """The built-in demo model (DiT-like, two block lists) and one forward's inputs."""
    if not size_gb > 0:
        raise ConfigError("size_gb", f"must be > 0, got {size_gb!r}")

    def build() -> tuple[torch.nn.Module, dict[str, Any]]:
        from ..model.demo import build_demo_model, demo_inputs

        model = build_demo_model(size_gb=size_gb, dtype=dtype, seed=0)
        return model, demo_inputs(model, batch=1, tokens=tokens, seed=0)

    return build


def candidate_policies(
    max_blocks: int,
    *,
    onload_device: str,
    disk_path: str | None = None,
    vram_budget: int | None = None,
) -> list[OffloadPolicy]:
    """A few plans spanning the trade-off: small groups (least VRAM) to whole block lists.

    Pinned RAM only where the device can use it (not on a CPU-only machine); the disk tier only
    when a folder is given; one deeper-prefetch and one keep-resident-within-budget variant.
    """
    tiers: list[Tier] = []
    if torch.device(onload_device).type != "cpu":
        from ..policy import PinnedRamTier

        tiers.append(PinnedRamTier())
    tiers.append(RamTier())
    if disk_path:
        tiers.append(DiskTier(disk_path))
    sizes = sorted({1, min(2, max_blocks), max(1, max_blocks // 2), max_blocks})
    out = [OffloadPolicy(level=BlockLevel(k), tier=t) for t in tiers for k in sizes]
    fastest_tier = tiers[0]
    out.append(OffloadPolicy(level=BlockLevel(1), tier=fastest_tier, prefetch_depth=2))
    if vram_budget is not None:
        out.append(OffloadPolicy(level=BlockLevel(1), tier=fastest_tier, vram_budget=vram_budget))
    return out


def _planned_device_bytes(plan: Any) -> int | None:
    for name in ("device_bytes", "peak_device_bytes"):
        v = getattr(plan, name, None)
        if isinstance(v, int):
            return v
    d = plan.as_dict()
    for name in ("device_bytes", "peak_device_bytes"):
        if isinstance(d.get(name), int):
            return int(d[name])
    return None


def recommend(rows: Sequence[TuneRow], budget: Budget) -> tuple[TuneRow | None, str]:
    """The fastest row that ran and fits; ties go to the smaller VRAM peak."""
    ok = [r for r in rows if r.fits and r.seconds_per_forward is not None]
    if ok:
        best = min(ok, key=lambda r: (r.seconds_per_forward, r.peak_vram or 0))
        return best, (
            f"recommended: #{best.index} {best.label} — {best.seconds_per_forward:.4f} s per forward, "
            f"the fastest of the {len(ok)} plan(s) that fit the budget"
        )
    ran = [r for r in rows if r.seconds_per_forward is not None]
    if not ran:
        return None, "no plan ran; see the note column"
    low_vram = min(r.peak_vram or 0 for r in ran)
    low_ram = min(r.peak_ram or 0 for r in ran)
    hints = []
    if budget.vram_bytes is not None and low_vram > budget.vram_bytes:
        hints.append(f"raise vram_budget_gb to at least {low_vram / GIB:.3g}")
    if budget.ram_bytes is not None and low_ram > budget.ram_bytes:
        hints.append(f"raise ram_budget_gb to at least {low_ram / GIB:.3g}, or add a disk folder")
    return None, "no plan fits the budget: " + ("; ".join(hints) or "raise a budget")


def _fits(budget: Budget, vram: int | None, ram: int | None) -> bool:
    if budget.vram_bytes is not None and vram is not None and vram > budget.vram_bytes:
        return False
    return not (budget.ram_bytes is not None and ram is not None and ram > budget.ram_bytes)


def autotune(
    model_factory: ModelFactory | None = None,
    *,
    budget: Budget | None = None,
    onload_device: str = "cpu",
    disk_path: str | None = None,
    candidates: Sequence[OffloadPolicy] | None = None,
    steps: int = 3,
    warmup: int = 1,
    progress: Progress | None = None,
) -> TuneResult:
    """Measures each candidate policy; see the module docstring."""
    budget = budget or Budget()
    budget.validate()
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError("steps", f"must be a whole number >= 1, got {steps!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError("warmup", f"must be a whole number >= 0, got {warmup!r}")
    device = torch.device(onload_device)
    factory = model_factory or demo_factory()
    policies, planned, max_blocks = _plan_all(factory, device, budget, disk_path, candidates)
    total = len(policies)
    rows: list[TuneRow] = []
    for i, (policy, plan_bytes) in enumerate(zip(policies, planned, strict=True), start=1):
        label = describe_policy(policy)
        if progress is not None:
            progress(i - 1, total, f"measuring {label}")
        rows.append(_measure(i, label, policy, plan_bytes, factory, device, budget, steps, warmup))
        gc.collect()
    if progress is not None:
        progress(total, total, "done")
    best, reason = recommend(rows, budget)
    return TuneResult(rows, budget, str(device), best, reason, {"max_blocks_per_group": max_blocks})


def _plan_all(
    factory: ModelFactory,
    device: torch.device,
    budget: Budget,
    disk_path: str | None,
    candidates: Sequence[OffloadPolicy] | None,
) -> tuple[list[OffloadPolicy], list[int | None], int]:
    """Plans every candidate first: nothing moves, and a bad setting fails now, not after
    minutes of measuring. Returns the policies, each one's planned device bytes, and the
    model's longest block list."""
    model, _ = factory()
    first = OffloadPolicy(level=BlockLevel(1), tier=RamTier())
    max_blocks = plan_offload(model, first, onload_device=str(device)).max_blocks_per_group
    if candidates is not None:
        policies = list(candidates)
    else:
        policies = candidate_policies(
            max_blocks,
            onload_device=str(device),
            disk_path=disk_path,
            vram_budget=budget.vram_bytes,
        )
    if not policies:
        raise ConfigError("candidates", "needs at least one policy to measure")
    planned = [
        _planned_device_bytes(plan_offload(model, p, onload_device=str(device))) for p in policies
    ]
    del model
    gc.collect()
    return policies, planned, max_blocks


def _measure(
    index: int,
    label: str,
    policy: OffloadPolicy,
    plan_bytes: int | None,
    factory: ModelFactory,
    device: torch.device,
    budget: Budget,
    steps: int,
    warmup: int,
) -> TuneRow:
    model, inputs = factory()
    m = measure_policy(
        model, inputs, policy, device, name=f"planner #{index}", steps=steps, warmup=warmup
    )
    if m.error is not None:
        return TuneRow(index, label, policy, None, None, False, m.peak_ram, m.peak_ram_file,
                       False, m.error)  # fmt: skip
    # Without an accelerator that reports memory, the plan's device bytes stand in.
    vram = m.peak_vram if m.peak_vram is not None else plan_bytes
    return TuneRow(
        index=index, label=label, policy=policy, seconds_per_forward=m.seconds_per_forward,
        peak_vram=vram, vram_measured=m.peak_vram is not None, peak_ram=m.peak_ram,
        peak_ram_file=m.peak_ram_file, fits=_fits(budget, vram, m.peak_ram),
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m offload_core.tools.autotune", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument(
        "--size-gb", type=float, default=0.05, help="demo model size in GiB (default 0.05)"
    )
    ap.add_argument("--tokens", type=int, default=64, help="tokens per forward (default 64)")
    ap.add_argument(
        "--device", default=None, help="onload device (default: the accelerator, else cpu)"
    )
    ap.add_argument("--vram-budget-gb", default=None, help="VRAM the plan may use (GiB)")
    ap.add_argument("--ram-budget-gb", default=None, help="RAM the plan may use (GiB)")
    ap.add_argument("--disk-path", default=None, help="also try the disk tier in this folder")
    ap.add_argument("--steps", type=int, default=3, help="timed forwards per plan (default 3)")
    args = ap.parse_args(argv)

    try:
        budget = Budget.from_gb(args.vram_budget_gb, args.ram_budget_gb)
        device = args.device or _default_onload()
        result = autotune(
            demo_factory(args.size_gb, args.tokens),
            budget=budget,
            onload_device=device,
            disk_path=args.disk_path,
            steps=args.steps,
            progress=lambda d, t, what: print(f"[{d}/{t}] {what}", file=sys.stderr, flush=True),
        )
    except ConfigError as e:
        print(f"ferry planner: {e}", file=sys.stderr)
        return 2
    print(result.summary())
    return 0


def _default_onload() -> str:
    from .monitor import default_device

    return default_device() or "cpu"


if __name__ == "__main__":
    raise SystemExit(main())
