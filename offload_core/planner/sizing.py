"""How big a group is and how far ahead it is fetched, for one network on one tier.

[Note: a group worth its launch] Every group costs a fixed overhead besides its bytes: the
pre-hook, a copy launch (or a read request), an event. A group whose copy takes twenty times
that overhead spends at most 5 % of its time on it, so groups grow, block by block, until
their transfer takes ``GROUP_OVERHEAD_S / LAUNCH_SHARE`` at the tier's speed. Bigger groups
only cost VRAM (each slot holds one), so they stop there.

[Note: look-ahead] A group takes ``group / tier speed`` to arrive and ``group / compute
speed`` to be used, so ``ceil(compute speed / tier speed)`` groups in flight keep the compute
fed while groups kept on the GPU compute between streamed ones (the reader catches up
during them). Transfers run one after another, so a tier slower than compute is hidden only
where the streamed share of the groups is small enough (``speed >= compute speed x streamed
share``); otherwise the tier sets the pace and the depth only keeps the reader busy. It stays
at ``MAX_AUTO_DEPTH`` at most: each group ahead is one more slot of VRAM (or RAM on a CPU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..policy import TierName
from ..units import GB, fmt_bytes
from .facts import MachineFacts, NetworkFacts

GROUP_OVERHEAD_S = 100e-6
LAUNCH_SHARE = 0.05
MAX_AUTO_DEPTH = 4


@dataclass(frozen=True)
class Sizing:
    blocks_per_group: int
    prefetch_depth: int
    group_bytes: int  # the largest group
    n_groups: int

    @property
    def slot_bytes(self) -> int:
        """The streaming slots: the group computing and the groups ahead."""
        return (self.prefetch_depth + 1) * self.group_bytes


def _largest_group(blocks: tuple[int, ...], n: int) -> int:
    return max(sum(blocks[i : i + n]) for i in range(0, len(blocks), n))


def size(net: NetworkFacts, tier: TierName, machine: MachineFacts, room: int | None) -> Sizing:
    """Blocks per group and look-ahead for ``net`` on ``tier``: the user's where set, else
    the Notes' rules; both lowered (auto ones only) until the slots fit in ``room``."""
    blocks = net.block_bytes or (net.nbytes,)
    longest = net.longest_list or len(blocks)
    speed = machine.tier_gbps(tier) * GB
    wish = net.wish
    if wish.blocks_per_group is not None:
        n = min(wish.blocks_per_group, longest)
    else:
        want = GROUP_OVERHEAD_S * speed / LAUNCH_SHARE
        n = max(1, min(longest, math.ceil(want / (sum(blocks) / len(blocks)))))
    n_groups = math.ceil(len(blocks) / n)
    if wish.prefetch_depth is not None:
        depth = wish.prefetch_depth
    else:
        ahead = math.ceil(machine.device_gbps * GB / speed)
        depth = max(1, min(ahead, MAX_AUTO_DEPTH, max(n_groups - 1, 1)))
    group = _largest_group(blocks, n)
    while room is not None and (depth + 1) * group > room:
        if wish.prefetch_depth is None and depth > 1:
            depth -= 1
        elif wish.blocks_per_group is None and n > 1:
            n -= 1
            group = _largest_group(blocks, n)
        else:
            break  # the user's values, or one block: plan.py says what does not fit
    return Sizing(n, depth, group, math.ceil(len(blocks) / n))


def pace_phrase(
    s: Sizing, tier: TierName, machine: MachineFacts, streamed_share: float = 1.0
) -> str:
    """The sizing half of a choice's sentence: group size, look-ahead and the speed it hides
    (``streamed_share``: the share of the groups that stream, the rest stay on the GPU)."""
    speed = machine.tier_gbps(tier)
    how = "read" if tier == "disk" else "copy"
    said = machine.tier_said(tier)
    blocks = f"groups of {s.blocks_per_group} block{'s' * (s.blocks_per_group > 1)}"
    ahead = f"{s.prefetch_depth} group{'s' * (s.prefetch_depth > 1)} ahead"
    head = f"{blocks} ({fmt_bytes(s.group_bytes)}), {ahead}"
    if speed >= machine.device_gbps * streamed_share:
        return f"{head} hide{'s' * (s.prefetch_depth == 1)} a {speed:.1f} GB/s {how}{said}"
    compute = "" if machine.compute_gbps else ", assumed"
    return (
        f"{head}: a {speed:.1f} GB/s {how}{said} is slower than compute uses weights "
        f"(~{machine.device_gbps:.1f} GB/s{compute}), so the {tier} tier sets the pace"
    )
