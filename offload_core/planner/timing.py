"""How long a prompt will take, from the plan's own figures: each network's reads (its
streamed bytes at its tier's speed, set against its compute where a prompt measured it), its
load, and the sampler's steps.

[Note: transfer-bound] Until a prompt has run a network, nothing measured how fast compute
uses its weights: the time said is then its transfers' alone, a floor (compute may be
slower), and it is labelled "transfer-bound". With a measured compute speed
(``MachineFacts.compute_gbps``) a read takes the longer of its transfer and its compute: the
look-ahead overlaps them ([Note: look-ahead] in sizing.py).

[Note: a load] The first prompt lays each network out: its weights read once from its file,
and on the disk tier, where it cannot be read in place, its group files written to the disk
folder. Both are counted at the disk folder's read speed (the only disk figure there is: a
model file on another disk, or a slower write, makes the load longer than said); the share
kept on the onload device is copied there once, at its tier's speed.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..policy import TierName
from ..units import GB
from .facts import MachineFacts, NetworkFacts


@dataclass(frozen=True)
class Timing:
    """One network's predicted seconds: a read (one forward through its weights), its load,
    the first prompt (load + every read), and the bytes a prompt reads from the disk."""

    read_s: float
    load_s: float
    prompt_s: float
    disk_read_bytes: int
    transfer_bound: bool

    def as_dict(self) -> dict[str, float | int | bool]:
        return {
            "read_seconds": round(self.read_s, 3),
            "load_seconds": round(self.load_s, 3),
            "prompt_seconds": round(self.prompt_s, 3),
            "disk_read_per_prompt": self.disk_read_bytes,
            "transfer_bound": self.transfer_bound,
        }


def network_timing(
    net: NetworkFacts, tier: TierName, resident: int, machine: MachineFacts
) -> Timing:
    """``net`` on ``tier`` with ``resident`` bytes kept on the onload device (the Notes). A
    network no Ferry node offloads moves nothing of Ferry's: its reads cost compute alone."""
    streamed = max(0, net.nbytes - resident) if net.ferry else 0
    transfer = streamed / (machine.tier_gbps(tier) * GB)
    compute = net.nbytes / (machine.compute_gbps * GB) if machine.compute_gbps else None
    read = transfer if compute is None else max(transfer, compute)
    disk = machine.disk_gbps * GB
    written = net.nbytes if net.ferry and tier == "disk" and not net.in_place else 0
    # The share kept on the onload device arrives there once, from its tier.
    load = (net.nbytes + written) / disk + (resident if net.ferry else 0) / (
        machine.tier_gbps(tier) * GB
    )
    reads = streamed * net.reads_per_prompt if tier == "disk" else 0
    return Timing(read, load, load + read * net.reads_per_prompt, int(reads), compute is None)


def per_step(nets: list[NetworkFacts], timings: list[Timing], steps: int) -> float:
    """Seconds a sampling step takes: the per-step networks' reads in a step (a step with
    cfg reads the model twice: ``reads_per_prompt / steps``)."""
    return sum(
        t.read_s * n.reads_per_prompt / steps for n, t in zip(nets, timings) if n.kind.per_step
    )


def time_sentence(
    nets: list[NetworkFacts], timings: list[Timing], steps: int | None, machine: MachineFacts
) -> str:
    """The plan's time in one sentence, each figure said for what it is."""
    prompt = sum(t.prompt_s for t in timings)
    load = sum(t.load_s for t in timings)
    bound = any(t.transfer_bound for t in timings)
    head = "" if steps is None else f"~{per_step(nets, timings, steps):.2f} s a step, "
    disk = "" if machine.disk_measured else ", the disk speed assumed"
    label = (
        f" (transfer-bound: no compute time measured yet{disk})"
        if bound
        else ("" if machine.disk_measured else f" ({disk.removeprefix(', ')})")
    )
    return f"{head}~{prompt:.1f} s for the first prompt ({load:.1f} s of it loading){label}"
