"""The planner: every network of a prompt, on this machine, gets a tier, a group size and a
look-ahead, each said in one sentence with its figures; a choice a user forced that cannot
work is refused before any work, naming the setting to change.

Pure: it reads nothing (machine.py and network_file.py gather the facts), so every rule is
tested on fake machines (tests/test_planner.py). The rules: tiers.py ([Note: sharing the
RAM]), sizing.py ([Note: a group worth its launch], [Note: look-ahead]).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..errors import ConfigError
from ..policy import TierName
from ..units import fmt_bytes
from .facts import MachineFacts, NetworkFacts
from .picture import machine_room, where_waits
from .sizing import Sizing, pace_phrase, size
from .tiers import Split, disk_takes, fixed_tier, host_bytes, split
from .timing import Timing, network_timing, per_step, time_sentence


@dataclass(frozen=True)
class Choice:
    """What one network gets, and why (``reason``: one sentence with its figures)."""

    network: NetworkFacts
    tier: TierName
    sizing: Sizing
    vram_resident: int  # bytes kept on the GPU while it runs (0 on a CPU)
    ram_bytes: int  # its host tier's RAM (pinned or plain) plus its working RAM
    disk_bytes: int  # written to the disk folder (0 where read from its own file)
    reason: str
    #: Its predicted seconds and disk reads (timing.py); set by plan_graph.
    timing: Timing | None = None

    @property
    def blocks_per_group(self) -> int:
        return self.sizing.blocks_per_group

    @property
    def prefetch_depth(self) -> int:
        return self.sizing.prefetch_depth

    def as_dict(self) -> dict[str, Any]:
        n = self.network
        return {
            "name": n.name, "kind": n.kind.value, "title": n.title, "file": n.file,
            "bytes": n.nbytes, "tier": self.tier, "blocks_per_group": self.blocks_per_group,
            "prefetch_depth": self.prefetch_depth, "group_bytes": self.sizing.group_bytes,
            "vram_resident": self.vram_resident, "ram_bytes": self.ram_bytes,
            "disk_bytes": self.disk_bytes, "disk_read_per_prompt": self.disk_read_per_prompt,
            "transient_bytes": n.transient_bytes, "load_peak_bytes": n.load_peak_bytes,
            "reason": self.reason,
            **(self.timing.as_dict() if self.timing else {}),
        }  # fmt: skip

    def waits(self, on_gpu: bool) -> dict[str, int | None]:
        """Its bytes by where they wait, for the pre-flight's picture (picture.py)."""
        n = self.network
        return where_waits(
            on_gpu=on_gpu, tier=self.tier, nbytes=n.nbytes, vram_resident=self.vram_resident,
            slot_bytes=self.sizing.slot_bytes, transient_bytes=n.transient_bytes,
            ferry=n.ferry, ram_bytes=self.ram_bytes,
        )  # fmt: skip

    @property
    def disk_read_per_prompt(self) -> int:
        """Bytes a prompt reads from the disk for it: its streamed share, every read."""
        if self.timing is not None:
            return self.timing.disk_read_bytes
        return (
            int(self.network.nbytes * self.network.reads_per_prompt) if self.tier == "disk" else 0
        )


@dataclass(frozen=True)
class GraphPlan:
    """The plan of a prompt's networks: each one's choice, the predicted peaks, and either
    "fits" or the refusal (``refusal``: a ConfigError naming the setting to change)."""

    machine: MachineFacts
    choices: tuple[Choice, ...]
    ram_room: int
    peak_ram: int
    peak_vram: int | None
    disk_bytes: int
    refusal: ConfigError | None = None
    #: Where the RAM room is short but nothing is refused: what may not fit, and what to change.
    warning: str | None = None
    #: The sampler's steps (None: not known) and the predicted time (timing.py).
    steps: int | None = None
    time: str | None = None

    @property
    def fits(self) -> bool:
        return self.refusal is None and self.warning is None

    def check(self) -> GraphPlan:
        """Raises the refusal, if any; returns the plan."""
        if self.refusal is not None:
            raise self.refusal
        return self

    def choice(self, name: str) -> Choice:
        return next(c for c in self.choices if c.network.name == name)

    def verdict(self) -> str:
        if self.refusal is not None:
            return f"does not fit: {self.refusal}"
        if self.warning is not None:
            return f"may not fit: {self.warning}"
        vram = "" if self.peak_vram is None else f"VRAM {fmt_bytes(self.peak_vram)}, "
        return (
            f"fits: peak {vram}RAM {fmt_bytes(self.peak_ram)} "
            f"({fmt_bytes(self.ram_room)} for Ferry), disk {fmt_bytes(self.disk_bytes)}"
        )

    def as_dict(self) -> dict[str, Any]:
        on_gpu = self.machine.on_gpu  # the pre-flight's picture (picture.py) reads "waits"
        return {
            "networks": [{**c.as_dict(), "waits": c.waits(on_gpu)} for c in self.choices],
            "room": machine_room(self.machine, self.ram_room),
            "peak_ram": self.peak_ram, "peak_vram": self.peak_vram,
            "disk_bytes": self.disk_bytes, "ram_room": self.ram_room, "fits": self.fits,
            "verdict": self.verdict(),
            "setting": None if self.refusal is None else self.refusal.setting,
            "warning": self.warning, "time": self.time,
            "seconds_per_step": self.seconds_per_step, "seconds_per_prompt": self.seconds_per_prompt,
            "disk_read_per_prompt": sum(c.disk_read_per_prompt for c in self.choices),
        }  # fmt: skip

    def _timings(self) -> list[Timing]:
        return [c.timing for c in self.choices if c.timing is not None]

    @property
    def seconds_per_step(self) -> float | None:
        """A sampling step's seconds (transfer-bound where no compute was measured)."""
        timed = self._timings()
        if self.steps is None or len(timed) != len(self.choices):
            return None
        return round(per_step([c.network for c in self.choices], timed, self.steps), 3)

    @property
    def seconds_per_prompt(self) -> float:
        """The first prompt's seconds: every network's load and reads."""
        return round(sum(t.prompt_s for t in self._timings()), 3)


def ram_room(machine: MachineFacts, nets: list[NetworkFacts]) -> int:
    """RAM the networks' host tiers and slots may take: what is available (their own bytes a
    loader already holds count back: laying them out moves them) less the headroom, or the
    user's RAM budget where lower."""
    room = machine.ram_available + sum(n.held_bytes for n in nets) - machine.ram_headroom
    if machine.ram_budget is not None:
        room = min(room, machine.ram_budget)
    return max(0, room)


def plan_graph(
    machine: MachineFacts,
    nets: list[NetworkFacts],
    *,
    process_ram: int = 0,
    steps: int | None = None,
) -> GraphPlan:
    """Plans ``nets`` together on ``machine``. ``process_ram``: the host's own RAM besides
    the networks (for the predicted peak); ``steps``: the sampler's (for the time a step).
    Never raises for a plan that does not fit: the plan carries the refusal (``check()``
    raises it), so a pre-flight can show it."""
    for n in nets:
        n.wish.validate()
    room = ram_room(machine, nets)
    # The slots' RAM before the split (a CPU computes from RAM slots; a GPU's disk reads go
    # through staging buffers of a slot's size): one block, one ahead, at the least.
    first = [_working(n, machine, size(n, "disk", machine, None)) if n.ferry else 0 for n in nets]
    refusal = _refuse_forced(nets, machine)
    chosen = split(nets, machine, room, first) if refusal is None else None
    if chosen is None:  # refused: the choices are still drawn, for the pre-flight to show
        chosen = Split(tuple((fixed_tier(n) or ("disk",))[0] for n in nets), 0, None)
    choices = tuple(
        _timed(_choose(i, nets, machine, chosen, room, first), machine) for i in range(len(nets))
    )
    vram = [
        c.vram_resident
        + c.sizing.slot_bytes
        + (c.network.transient_bytes if c.network.ferry else 0)
        for c in choices
    ]
    need = sum(c.ram_bytes for c in choices)
    warning = _short_of_ram(nets, machine, need, room) if refusal is None else None
    choices = tuple(_said_loading(c) for c in choices)
    return GraphPlan(
        machine=machine,
        choices=choices,
        ram_room=room,
        peak_ram=process_ram + max(need, _loading_peak(choices)),
        peak_vram=max(vram, default=0) if machine.on_gpu else None,
        disk_bytes=sum(c.disk_bytes for c in choices),
        refusal=refusal,
        warning=warning,
        steps=steps,
        time=time_sentence(nets, [c.timing for c in choices if c.timing], steps, machine),
    )


def _short_of_ram(
    nets: list[NetworkFacts], machine: MachineFacts, need: int, room: int
) -> str | None:
    """The warning where the networks need more RAM than the room (None: they fit)."""
    if need <= room:
        return None
    return (
        f"the networks need {fmt_bytes(need)} of RAM and {fmt_bytes(room)} is available "
        f"for Ferry (after {fmt_bytes(machine.ram_headroom)} headroom); free RAM, raise the "
        "RAM budget, put the networks no Ferry node offloads behind one, or "
        + (
            "set their tier to auto or disk"
            if any(n.wish.tier in ("ram", "pinned") for n in nets)
            else "give a disk folder with room (disk_path)"
        )
    )


def _loading_peak(choices: tuple[Choice, ...]) -> int:
    """The RAM of the networks while the costliest loader runs: its loader's peak
    (loader_costs.py) in place of what the network holds once laid out, the others as
    they are (counted as loaded already: the host may load them in any order)."""
    need = sum(c.ram_bytes for c in choices)
    return max((need - c.ram_bytes + c.network.load_peak_bytes for c in choices), default=0)


def _said_loading(c: Choice) -> Choice:
    """The choice's sentence with what its loader costs while it loads, where known."""
    said = c.network.load_said
    return replace(c, reason=f"{c.reason}; {said}") if said else c


def _timed(c: Choice, machine: MachineFacts) -> Choice:
    return replace(c, timing=network_timing(c.network, c.tier, c.vram_resident, machine))


def _working(net: NetworkFacts, machine: MachineFacts, s: Sizing) -> int:
    """RAM a network takes besides its host tier: on a CPU its slots, what lies outside its
    blocks and a quantized layer's dequantized copy while it computes (the onload device is
    RAM); on a GPU the staging ring a disk or RAM tier reads through, a slot's size ([Note:
    the RAM tier through staging])."""
    if machine.on_gpu:
        return s.slot_bytes if net.wish.tier in ("disk", "ram") else 0
    return s.slot_bytes + net.outside_bytes + net.transient_bytes


def _choose(
    i: int, nets: list[NetworkFacts], machine: MachineFacts, sp: Split, room: int,
    first: list[int],
) -> Choice:  # fmt: skip
    net, tier = nets[i], sp.tiers[i]
    room_for_slots = machine.vram_for_ferry
    if not machine.on_gpu:  # the slots are RAM: a share of what the split left
        slack = first[i] + max(0, sp.ram_left) // len(nets)
        room_for_slots = slack if room_for_slots is None else min(slack, room_for_slots)
    s = size(net, tier, machine, room_for_slots)
    if not net.ferry:  # the host's own load: whole in RAM, nothing of Ferry's
        reason = _tier_clause(i, nets, machine, sp, room)
        # On a CPU its quantized layers' dequantized copies are RAM too.
        ram = net.nbytes + (0 if machine.on_gpu else net.transient_bytes)
        return Choice(net, "ram", Sizing(1, 1, 0, 1), 0, ram, 0, reason)
    vram = machine.vram_for_ferry
    resident = 0
    if vram is not None and net.nbytes + net.transient_bytes <= vram:
        # The whole network fits while it runs (vram_budget auto keeps it): nothing streams.
        resident, s = net.nbytes, Sizing(s.blocks_per_group, 1, 0, s.n_groups)
    elif vram is not None:
        resident = min(
            net.nbytes - s.group_bytes, max(0, vram - s.slot_bytes - net.transient_bytes)
        )
    working = _working(replace(net, wish=replace(net.wish, tier=tier)), machine, s)
    # A GPU's resident share still counts in its host tier: when the host unloads the network
    # to make room for the next one, it goes back there.
    reason = _tier_clause(i, nets, machine, sp, room)
    device = "GPU" if machine.on_gpu else "onload device (the VRAM budget)"
    if resident == net.nbytes:
        reason += f"; it stays on the {device} whole while it runs ({fmt_bytes(vram)} for it)"
    else:
        share = 1.0 - resident / net.nbytes if net.nbytes else 1.0
        reason += f"; {pace_phrase(s, tier, machine, share)}"
        if resident:
            reason += f"; {fmt_bytes(resident)} of it stays on the {device}"
    return Choice(
        network=net,
        tier=tier,
        sizing=s,
        vram_resident=resident,
        ram_bytes=working + (0 if tier == "disk" else host_bytes(net, machine, tier)),
        disk_bytes=net.nbytes if tier == "disk" and not net.in_place else 0,
        reason=reason,
    )


def _tier_clause(
    i: int, nets: list[NetworkFacts], machine: MachineFacts, sp: Split, room: int
) -> str:
    net, tier = nets[i], sp.tiers[i]
    size_of = f"{fmt_bytes(net.nbytes)} {net.title}"
    if not net.ferry:
        return f"ram: not behind a Ferry node, so ComfyUI keeps its {fmt_bytes(net.nbytes)} in RAM"
    if tier == "shared":
        return f"shared: set on its node ({size_of}); {shared_clause(net)}"
    if net.wish.tier is not None:
        return f"{tier}: set on its node ({size_of})"
    in_ram = [n for j, n in enumerate(nets) if j != i and sp.tiers[j] != "disk"]
    if tier == "disk":
        left = room - sum(n.nbytes for n in in_ram)
        after = " after " + " and ".join(
            f"the {n.title}'s {fmt_bytes(n.nbytes)}" for n in in_ram
        ) if in_ram else ""  # fmt: skip
        if net.nbytes > room:
            return f"disk: {size_of}, {fmt_bytes(room)} RAM available for Ferry"
        return (
            f"disk: {size_of}, {fmt_bytes(left)} RAM available{after}; read "
            f"{net.reads_per_prompt:g}x a prompt, it is the cheapest to read from disk"
        )
    if not machine.on_gpu:
        return f"ram: {size_of} fits in {fmt_bytes(room)} RAM available (CPU: nothing to pin)"
    limit = machine.pin_limit
    if tier == "pinned":
        lim = "no pin limit" if limit is None else f"the {fmt_bytes(limit)} pin limit"
        return f"pinned: {size_of} fits under {lim} and in {fmt_bytes(room)} RAM available"
    return (
        f"ram: {size_of} fits in {fmt_bytes(room)} RAM available but not in what is left of "
        f"the {fmt_bytes(limit or 0)} pin limit ({fmt_bytes(max(0, sp.pin_left or 0))})"
    )


def shared_clause(net: NetworkFacts) -> str:
    """How the shared tier's bytes are counted: once per machine."""
    if not net.shared_with:
        # The hosts do not tell yet whether another process holds it (NetworkFacts.shared_with
        # is 0 from them): counted whole, the safe side; the layout's note says what it found.
        return "counted whole here unless another process already holds it (the layout says)"
    others = f"{net.shared_with} other process{'es' if net.shared_with != 1 else ''}"
    return f"shared with {others}: its RAM counted once per machine, none added here"


def _refuse_forced(nets: list[NetworkFacts], machine: MachineFacts) -> ConfigError | None:
    """A tier a user set that cannot work on this machine, as the error naming the setting:
    pinned past the pin limit, or a disk folder without room for what it must hold. (RAM that
    runs short is a warning: the headroom may still hold it, and the kernel is the judge.)"""
    pinned = [n for n in nets if n.wish.tier == "pinned"]
    need = sum(n.nbytes for n in pinned)
    if machine.on_gpu and machine.pin_limit is not None and need > machine.pin_limit:
        return ConfigError(
            "tier",
            f"pinned needs {fmt_bytes(need)} for the "
            + " and ".join(n.title for n in pinned)
            + f" but the pin limit is {fmt_bytes(machine.pin_limit)}; set tier to auto or ram",
        )
    for n in nets:
        if n.wish.tier == "disk" and not disk_takes([n], machine):
            where = machine.disk_folder or "the disk folder"
            free = "no usable folder" if machine.disk_free is None else (
                f"{fmt_bytes(machine.disk_free)} free"
            )  # fmt: skip
            return ConfigError(
                "disk_path",
                f"{where} has {free} but the {n.title} writes {fmt_bytes(n.nbytes)} there; "
                "choose a folder with room (disk_path), or set tier to auto",
            )
    return None
