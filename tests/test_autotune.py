"""The planner: it measures each candidate plan, and its recommendation is the fastest plan
that fits the budget it was given, checked against the table it printed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from offload_core import BlockLevel, ConfigError, OffloadPolicy, RamTier, plan_offload
from offload_core.model.demo import build_demo_model
from offload_core.tools.autotune import Budget, TuneRow, autotune, demo_factory, main, recommend

SIZE_GB = 0.002  # 2 double + 4 single blocks: every candidate runs in well under a second
GIB = 1 << 30


def parse_printed(out: str) -> tuple[list[dict[str, str]], str]:
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| # |"))
    cols = [c.strip() for c in lines[head].strip("|").split("|")]
    rows = []
    for line in lines[head + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(cols, (c.strip() for c in line.strip("|").split("|")), strict=True)))
    verdict = next(line for line in lines if line.startswith(("recommended:", "no plan")))
    return rows, verdict


def test_cli_table_and_recommendation_is_fastest_plan_within_budget(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # A VRAM budget between the smallest and the largest plan, so that some plans do not fit.
    model = build_demo_model(SIZE_GB, torch.float32)
    small = plan_offload(
        model, OffloadPolicy(level=BlockLevel(1), tier=RamTier()), onload_device="cpu"
    )
    big = plan_offload(model, OffloadPolicy(level=BlockLevel(small.max_blocks_per_group), tier=RamTier()),
                       onload_device="cpu")  # fmt: skip
    budget_gb = (small.device_bytes + big.device_bytes) / 2 / GIB
    argv = ["--size-gb", str(SIZE_GB), "--tokens", "16", "--device", "cpu", "--steps", "2",
            "--vram-budget-gb", f"{budget_gb:.6f}", "--disk-path", str(tmp_path / "swap")]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    print(out)  # the table, in the test log
    rows, verdict = parse_printed(out)
    assert len(rows) >= 5
    assert any(r["plan"].endswith("disk, prefetch 1") for r in rows)
    for r in rows:
        vram = float(r["peak VRAM GiB"])
        # The printed fits column agrees with the printed numbers (4 decimals of GB).
        if abs(vram - budget_gb) > 1e-4:
            assert (r["fits"] == "yes") == (vram <= budget_gb), r
    fitting = [r for r in rows if r["fits"] == "yes" and r["s/forward"] != "-"]
    assert fitting and len(fitting) < len(rows), "the budget should split the table"
    best = min(fitting, key=lambda r: float(r["s/forward"]))
    m = re.match(r"recommended: #(\d+) ", verdict)
    assert m, verdict
    chosen = next(r for r in rows if r["#"] == m.group(1))
    assert chosen["fits"] == "yes"
    assert float(chosen["s/forward"]) == float(best["s/forward"])
    # The disk tier deletes what it wrote: nothing left in the folder Ferry was given.
    assert not (tmp_path / "swap").exists() or not any((tmp_path / "swap").rglob("*.safetensors"))


def _row(i: int, t: float | None, vram: int, ram: int, budget: Budget) -> TuneRow:
    fits = (budget.vram_bytes is None or vram <= budget.vram_bytes) and (
        budget.ram_bytes is None or ram <= budget.ram_bytes
    )
    return TuneRow(i, f"p{i}", OffloadPolicy(), t, vram, True, ram, 0, fits and t is not None)


def test_recommend_skips_faster_plans_that_do_not_fit() -> None:
    b = Budget(vram_bytes=10, ram_bytes=100)
    rows = [_row(1, 0.5, 5, 50, b), _row(2, 0.1, 20, 50, b), _row(3, 0.3, 9, 50, b), _row(4, 0.05, 5, 500, b),
            _row(5, None, 1, 1, b)]  # fmt: skip
    best, reason = recommend(rows, b)
    assert best is not None and best.index == 3
    assert reason.startswith("recommended: #3 ")


def test_recommend_when_nothing_fits_says_which_budget_to_raise() -> None:
    b = Budget(vram_bytes=1, ram_bytes=None)
    best, reason = recommend([_row(1, 0.5, 3 << 30, 50, b)], b)
    assert best is None and "raise vram_budget_gb to at least 3" in reason


def test_bad_budget_fails_before_any_work() -> None:
    def factory():  # type: ignore[no-untyped-def]
        raise AssertionError("no model may be built for an invalid budget")

    with pytest.raises(ConfigError, match=r"^vram_budget_gb: "):
        autotune(factory, budget=Budget.from_gb(-1, None))
    with pytest.raises(ConfigError, match=r"^steps: "):
        autotune(factory, steps=0)


def test_progress_is_reported_per_candidate() -> None:
    seen: list[tuple[int, int, str]] = []
    cands = [OffloadPolicy(level=BlockLevel(k), tier=RamTier()) for k in (1, 4)]
    result = autotune(demo_factory(SIZE_GB, tokens=8), candidates=cands, steps=1, warmup=0,
                      progress=lambda d, t, w: seen.append((d, t, w)))  # fmt: skip
    assert [(d, t) for d, t, _ in seen] == [(0, 2), (1, 2), (2, 2)]
    assert [r.policy for r in result.rows] == cands
    assert all(r.seconds_per_forward and r.seconds_per_forward > 0 for r in result.rows)
    # No budget: everything fits, and the recommendation is the faster of the two.
    assert result.recommended == min(result.rows, key=lambda r: r.seconds_per_forward or 0)
