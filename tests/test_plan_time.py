"""The pre-flight's predicted time and disk reads (offload_core/planner/timing.py): per
network and for the prompt, from the plan's own figures, transfer-bound (and said so) until a
prompt measured compute."""

from __future__ import annotations

import pytest

from offload_core.planner import MachineFacts, NetworkFacts, Wish, plan_graph
from offload_core.units import GB, GIB


def model(gib: float = 8, reads: float = 40, **kw: object) -> NetworkFacts:
    n = int(gib * GIB)
    return NetworkFacts("m", "model", n, (n // 16,) * 16, reads_per_prompt=reads, **kw)  # type: ignore[arg-type]


def encoder(gib: float = 4) -> NetworkFacts:
    n = int(gib * GIB)
    return NetworkFacts("t5", "text_encoder", n, (n // 8,) * 8, in_place=True)


def cpu(**kw: object) -> MachineFacts:
    return MachineFacts(
        vram_free=None, ram_available=64 * GIB, disk_free=500 * GIB, disk_folder="/d", **kw
    )  # type: ignore[arg-type]


def test_a_disk_model_is_transfer_bound_until_compute_is_measured() -> None:
    m = cpu(disk_gbps=2.0, disk_measured=True)
    net = model(wish=Wish(tier="disk"))
    plan = plan_graph(m, [net, encoder()], steps=20)
    c, te = plan.choices
    read = net.nbytes / (2.0 * GB)
    assert c.timing is not None and c.timing.read_s == pytest.approx(read)
    assert c.timing.load_s == pytest.approx(2 * net.nbytes / (2.0 * GB))  # read, then written
    assert c.timing.transfer_bound and c.disk_read_per_prompt == net.nbytes * 40
    assert plan.seconds_per_step == pytest.approx(2 * read, abs=1e-3)  # cfg: two reads a step
    load_te = encoder().nbytes / (2.0 * GB)  # read once from its file; RAM tier, CPU copies
    te_read = encoder().nbytes / (4.0 * GB)
    assert te.timing is not None and te.timing.prompt_s == pytest.approx(load_te + te_read)
    total = c.timing.load_s + 40 * read + load_te + te_read
    assert plan.seconds_per_prompt == pytest.approx(total, abs=1e-3)
    d = plan.as_dict()
    assert d["disk_read_per_prompt"] == net.nbytes * 40 and d["seconds_per_step"] > 0
    assert d["networks"][0]["transfer_bound"] and d["networks"][0]["read_seconds"] > 0
    assert plan.time is not None and "transfer-bound: no compute time measured yet" in plan.time
    assert "the disk speed assumed" not in plan.time
    assert plan.time.startswith(f"~{2 * read:.2f} s a step, ~{total:.1f} s for the first prompt")


def test_a_measured_compute_sets_the_pace_where_it_is_slower() -> None:
    m = cpu(disk_gbps=2.0, disk_measured=True, compute_gbps=0.25)
    plan = plan_graph(m, [model(wish=Wish(tier="disk"))], steps=20)
    (c,) = plan.choices
    assert c.timing is not None and not c.timing.transfer_bound
    assert c.timing.read_s == pytest.approx(c.network.nbytes / (0.25 * GB))
    assert plan.time is not None and "transfer-bound" not in plan.time


def test_an_assumed_disk_speed_is_said_and_no_steps_no_step_time() -> None:
    plan = plan_graph(cpu(), [model(wish=Wish(tier="disk"))])
    assert plan.seconds_per_step is None and plan.time is not None
    assert plan.time.startswith("~") and " s a step" not in plan.time
    assert "the disk speed assumed" in plan.time


def test_a_gpus_resident_share_is_read_from_disk_no_more() -> None:
    gpu = MachineFacts(
        vram_free=6 * GIB, ram_available=4 * GIB, pin_limit=None, disk_free=500 * GIB,
        disk_folder="/d", disk_gbps=3.0, disk_measured=True,
    )  # fmt: skip
    plan = plan_graph(gpu, [model(wish=Wish(tier="disk"))], steps=10)
    (c,) = plan.choices
    assert 0 < c.vram_resident < c.network.nbytes
    streamed = c.network.nbytes - c.vram_resident
    assert c.disk_read_per_prompt == streamed * 40
    assert c.timing is not None and c.timing.read_s == pytest.approx(streamed / (3.0 * GB))
