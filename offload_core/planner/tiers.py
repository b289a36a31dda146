"""Where each network's weights wait between uses: pinned RAM, RAM or disk, for all the
prompt's networks together.

[Note: sharing the RAM] Every network a prompt loads stays laid out across prompts (the host
keeps them loaded), so their host tiers add up. The planner keeps the networks whose disk
reads would cost the most in RAM: of every split into "in RAM" and "on disk" that fits, it
takes the one whose disk networks read the fewest seconds a prompt (bytes x reads a prompt /
disk speed), so of two networks that each fit but not together, the one read least (a text
encoder: once a prompt, against a diffusion model's every step) goes to disk. Networks are
few (two to four), so every split is tried. Then the RAM networks are pinned, most-read
first, while the pinned share stays under the pin limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from ..disk.folder import room_needed
from ..policy import TierName
from ..units import GB
from .facts import MachineFacts, NetworkFacts


@dataclass(frozen=True)
class Split:
    """Each network's tier, and what the split left over."""

    tiers: tuple[TierName, ...]
    ram_left: int  # of the RAM room, after the host tiers and the working memory
    pin_left: int | None  # of the pin limit (None: no limit)


def fixed_tier(net: NetworkFacts) -> tuple[TierName] | None:
    """The tier the planner may not change: the user's, or "ram" for a network no Ferry
    node offloads (the host keeps it whole in RAM)."""
    if not net.ferry:
        return ("ram",)
    return None if net.wish.tier is None else (net.wish.tier,)


def host_bytes(net: NetworkFacts, machine: MachineFacts, tier: TierName | None = None) -> int:
    """What a network's host tier holds: all of it, less (on a CPU) what lies outside its
    blocks, which the working RAM counts (the onload device holds it). On the shared tier,
    where another process already holds it, nothing: shared bytes count once per machine,
    and the RAM available already leaves them out."""
    if tier == "shared" and net.shared_with:
        return 0
    return net.nbytes - (0 if machine.on_gpu else net.outside_bytes)


def disk_cost(net: NetworkFacts, machine: MachineFacts) -> float:
    """Seconds a prompt spends reading ``net`` from disk."""
    return net.nbytes * net.reads_per_prompt / (machine.disk_gbps * GB)


def disk_takes(nets: list[NetworkFacts], machine: MachineFacts) -> bool:
    """Whether the disk folder has room for what these networks would write there, as the
    run counts it (``room_needed``: the group files and the margin)."""
    written = sum(n.nbytes for n in nets if not n.in_place)
    if not written:
        return True
    return machine.disk_free is not None and room_needed(written) <= machine.disk_free


def split(
    nets: list[NetworkFacts], machine: MachineFacts, room: int, working: list[int]
) -> Split | None:
    """The cheapest split that fits (Note above). Where none fits in ``room``, the one that
    overflows it least (``Split.ram_left`` negative: the plan warns, the headroom may still
    hold it); None only where the disk folder cannot take what must go there. A user's tier
    is kept as set; ``working`` is each network's RAM besides its host tier (its slots)."""
    best: tuple[tuple[int, float, int, int], tuple[TierName, ...]] | None = None
    options: list[tuple[TierName, ...]] = [fixed_tier(n) or ("ram", "disk") for n in nets]
    for tiers in product(*options):
        in_ram = sum(host_bytes(n, machine, t) for n, t in zip(nets, tiers) if t != "disk")
        used = in_ram + sum(working)
        on_disk = [n for n, t in zip(nets, tiers) if t == "disk"]
        if not disk_takes(on_disk, machine):
            continue
        cost = sum(disk_cost(n, machine) for n in on_disk)
        key = (max(0, used - room), cost, len(on_disk), used)
        if best is None or key < best[0]:
            best = (key, tuple(tiers))  # type: ignore[arg-type]
    if best is None:
        return None
    return _pin(nets, best[1], machine, room - best[0][3])


def _pin(
    nets: list[NetworkFacts], tiers: tuple[TierName, ...], machine: MachineFacts, ram_left: int
) -> Split:
    """Pins the RAM networks the user left on auto, most-read first, under the pin limit
    (after what the user pinned). On a CPU nothing is pinned: there is no copy to speed up."""
    out = list(tiers)
    limit = machine.pin_limit
    pinned = sum(n.nbytes for n, t in zip(nets, tiers) if t == "pinned")
    if not machine.on_gpu:
        return Split(tuple(out), ram_left, None)
    order = sorted(range(len(nets)), key=lambda i: (-nets[i].reads_per_prompt, -nets[i].nbytes))
    for i in order:
        fits = limit is None or pinned + nets[i].nbytes <= limit
        if fixed_tier(nets[i]) is None and out[i] == "ram" and fits:
            out[i] = "pinned"
            pinned += nets[i].nbytes
    return Split(tuple(out), ram_left, None if limit is None else limit - pinned)
