"""What the pre-flight's picture reads from /ferry/plan's body (offload_core/planner/
picture.py): per network where its bytes wait (VRAM / RAM / disk), and the machine's room,
the same figures the plan's peaks and verdict are made of."""

from __future__ import annotations

from offload_core.planner import MachineFacts, NetworkFacts, Wish, plan_graph
from offload_core.units import GIB


def model(gib: float, tier: str = "auto") -> NetworkFacts:
    n = int(gib * GIB)
    return NetworkFacts("m", "model", n, (n // 16,) * 16, reads_per_prompt=40, wish=Wish(tier=tier))  # type: ignore[arg-type]


def encoder(gib: float = 4) -> NetworkFacts:
    n = int(gib * GIB)
    return NetworkFacts("t5", "text_encoder", n, (n // 8,) * 8, in_place=True)


def test_a_gpus_plan_says_where_each_network_waits_and_the_room() -> None:
    gpu = MachineFacts(
        vram_free=6 * GIB, ram_available=16 * GIB, disk_free=500 * GIB, disk_folder="/d",
    )  # fmt: skip
    plan = plan_graph(gpu, [model(12, tier="disk"), encoder()], steps=20)
    d = plan.as_dict()
    assert d["room"] == {"vram": 6 * GIB, "ram": plan.ram_room, "disk": 500 * GIB}
    m, te = d["networks"]
    # On the disk tier the model's bytes wait there; on the GPU its resident share and slots.
    assert m["waits"]["disk"] == 12 * GIB and m["tier"] == "disk"
    assert 0 < m["waits"]["vram"] <= 6 * GIB
    assert m["waits"]["vram"] >= m["vram_resident"] > 0
    assert te["waits"]["disk"] == (4 * GIB if te["tier"] == "disk" else 0)
    # The bars add up to the plan's own peaks: RAM is the networks' RAM, VRAM the largest.
    assert sum(n["waits"]["ram"] for n in d["networks"]) == plan.peak_ram
    assert max(n["waits"]["vram"] for n in d["networks"]) == plan.peak_vram
    # And the time the picture writes beside them is the network's own.
    assert m["prompt_seconds"] > m["load_seconds"] > 0 and m["transfer_bound"] is True


def test_a_cpus_plan_has_no_vram_to_draw() -> None:
    cpu = MachineFacts(vram_free=None, ram_available=64 * GIB, disk_free=None)
    plan = plan_graph(cpu, [model(8, tier="ram")])
    d = plan.as_dict()
    assert d["room"] == {"vram": None, "ram": plan.ram_room, "disk": None}
    (m,) = d["networks"]
    assert m["waits"] == {"vram": None, "ram": m["ram_bytes"], "disk": 0}
    assert m["waits"]["ram"] >= 8 * GIB  # its RAM tier, and its slots beside it
