"""The whole-graph planner on fake machines (offload_core/planner): VRAM, RAM, pin limit and
disk speed in, each network's tier, group size, look-ahead and sentence out."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from offload_core.errors import ConfigError
from offload_core.planner import MachineFacts, NetworkFacts, Wish, disk_speed, plan_graph
from offload_core.planner.facts import ASSUMED_DISK_GBPS
from offload_core.planner.machine import default_pin_limit, default_ram_headroom, read_machine
from offload_core.planner.network_file import network_from_file
from offload_core.planner.sizing import MAX_AUTO_DEPTH
from offload_core.units import GIB, MIB

from .planner_files import bytes_read, dit_tensors, sparse_safetensors


def te(gib: float = 9, **kw: object) -> NetworkFacts:
    """A T5-like text encoder: 24 blocks, read once a prompt."""
    n = int(gib * GIB)
    return NetworkFacts("t5xxl", "text_encoder", n, (n // 24,) * 24, **kw)  # type: ignore[arg-type]


def dm(gib: float = 12, reads: float = 20, **kw: object) -> NetworkFacts:
    """A Flux-like diffusion model: 57 blocks, read every step."""
    n = int(gib * GIB)
    return NetworkFacts("flux", "model", n, (n // 57,) * 57, reads_per_prompt=reads, **kw)  # type: ignore[arg-type]


def cpu(ram_gib: float, disk_gib: float | None = 500, **kw: object) -> MachineFacts:
    return MachineFacts(
        vram_free=None,
        ram_available=int(ram_gib * GIB),
        disk_free=None if disk_gib is None else int(disk_gib * GIB),
        disk_folder="/nvme/ferry",
        **kw,  # type: ignore[arg-type]
    )


def gpu(vram_gib: float, ram_gib: float, pin_gib: float | None, **kw: object) -> MachineFacts:
    return MachineFacts(
        vram_free=int(vram_gib * GIB),
        ram_available=int(ram_gib * GIB),
        pin_limit=None if pin_gib is None else int(pin_gib * GIB),
        disk_free=500 * GIB,
        disk_folder="/nvme/ferry",
        **kw,  # type: ignore[arg-type]
    )


# machine, networks, expected tier per network (in order)
TIER_TABLE = [
    pytest.param(cpu(64), [te(), dm()], ["ram", "ram"], id="cpu-everything-fits"),
    pytest.param(cpu(20), [te(), dm()], ["disk", "ram"], id="cpu-each-fits-not-both-te-to-disk"),
    pytest.param(cpu(20), [te(reads_per_prompt=40), dm(reads=1)], ["ram", "disk"],
                 id="cpu-each-fits-not-both-least-read-to-disk"),
    pytest.param(cpu(8), [te(), dm()], ["disk", "disk"], id="cpu-smaller-than-model-both-disk"),
    pytest.param(cpu(64, ram_budget=16 * GIB), [te(), dm()], ["disk", "ram"],
                 id="cpu-ram-budget-caps"),
    pytest.param(gpu(8, 64, 40), [te(), dm()], ["pinned", "pinned"], id="gpu-both-pinned"),
    pytest.param(gpu(8, 64, 14), [te(), dm()], ["ram", "pinned"],
                 id="gpu-pin-limit-holds-one-most-read-pinned"),
    pytest.param(gpu(8, 64, 0), [te(), dm()], ["ram", "ram"], id="gpu-pinning-off"),
    pytest.param(gpu(8, 20, 40), [te(), dm()], ["disk", "pinned"], id="gpu-ram-short"),
    pytest.param(cpu(8), [te(held_bytes=9 * GIB), dm()], ["disk", "ram"],
                 id="held-bytes-count-back"),
]  # fmt: skip


@pytest.mark.parametrize(("machine", "nets", "tiers"), TIER_TABLE)
def test_tiers(machine: MachineFacts, nets: list[NetworkFacts], tiers: list[str]) -> None:
    plan = plan_graph(machine, nets)
    assert plan.fits, plan.verdict()
    assert [c.tier for c in plan.choices] == tiers
    for c in plan.choices:
        assert c.reason.startswith(f"{c.tier}: ")
        assert ("GiB" in c.reason and "ahead" in c.reason) or "GPU whole" in c.reason
    assert plan.peak_ram <= plan.ram_room


def test_disk_reason_names_the_other_network_and_its_bytes() -> None:
    plan = plan_graph(cpu(20), [te(), dm()])
    reason = plan.choice("t5xxl").reason
    assert "6.00 GiB RAM available after the model flux's 12.00 GiB" in reason
    assert "0.5 GB/s read (assumed)" in reason
    measured = plan_graph(cpu(20, disk_gbps=1.9, disk_measured=True), [te(), dm()])
    assert "1.9 GB/s read;" in measured.choice("t5xxl").reason + ";"


def test_cpu_ram_choice_says_nothing_is_pinned() -> None:
    plan = plan_graph(cpu(64), [dm()])
    assert "CPU: nothing to pin" in plan.choices[0].reason
    assert plan.peak_vram is None


def test_gpu_network_that_fits_vram_stays_whole() -> None:
    plan = plan_graph(gpu(24, 64, 40), [dm(12)])
    c = plan.choices[0]
    assert c.vram_resident == 12 * GIB and c.prefetch_depth == 1
    assert "stays on the GPU whole" in c.reason
    assert plan.peak_vram == 12 * GIB


def test_gpu_partial_residency_and_vram_peak_under_budget() -> None:
    machine = gpu(10, 64, 40)
    plan = plan_graph(machine, [dm(12)])
    c = plan.choices[0]
    assert 0 < c.vram_resident < 12 * GIB
    assert plan.peak_vram is not None and plan.peak_vram <= machine.vram_for_ferry  # type: ignore[operator]
    assert "of it stays on the GPU" in c.reason


@pytest.mark.parametrize(
    ("block", "gbps", "blocks"),
    [(1 * MIB, 4.0, 8), (256 * MIB, 4.0, 1), (1 * MIB, 0.5, 1), (64 * 1024, 4.0, 96)],
    ids=["small-blocks-grouped", "big-blocks-one", "slow-tier-one", "capped-at-the-list"],
)
def test_group_is_worth_its_launch(block: int, gbps: float, blocks: int) -> None:
    # 100 us overhead at 5 %: a group's transfer takes >= 2 ms at the tier's speed.
    net = NetworkFacts("m", "model", block * 96, (block,) * 96)
    plan = plan_graph(cpu(64, copy_gbps=gbps, disk_gbps=gbps, disk_measured=True), [net])
    c = plan.choices[0]
    assert c.blocks_per_group == blocks
    if 1 < blocks < 96:  # grouped: just past 2 ms of transfer, one block less is under it
        assert c.sizing.group_bytes / (gbps * 1e9) >= 2e-3 > (blocks - 1) * block / (gbps * 1e9)


def test_look_ahead_hides_a_tier_faster_than_compute() -> None:
    plan = plan_graph(gpu(4, 64, 40, compute_gbps=20.0, copy_gbps=25.0), [dm(12)])
    assert plan.choices[0].prefetch_depth == 1
    assert "1 group ahead hides a 25.0 GB/s copy" in plan.choices[0].reason


def test_look_ahead_deepens_for_a_slow_disk_and_says_it_sets_the_pace() -> None:
    machine = gpu(6, 8, 40, compute_gbps=20.0, disk_gbps=1.9, disk_measured=True)
    plan = plan_graph(machine, [dm(12)])
    c = plan.choices[0]
    assert c.tier == "disk" and c.prefetch_depth == MAX_AUTO_DEPTH
    assert (
        "1.9 GB/s read is slower than compute" in c.reason and "disk tier sets the pace" in c.reason
    )


def test_look_ahead_hides_a_slow_read_behind_resident_groups() -> None:
    # 22 GiB for a 24 GiB model: a sixth streams, so a 4 GB/s read keeps up with 20 GB/s.
    machine = gpu(24, 64, 40, compute_gbps=20.0, disk_gbps=4.0, disk_measured=True)
    plan = plan_graph(machine, [dm(24, in_place=True, wish=Wish(tier="disk"))])
    c = plan.choices[0]
    assert c.prefetch_depth == 4 and "groups ahead hide a 4.0 GB/s read" in c.reason


def test_look_ahead_lowered_to_fit_the_vram() -> None:
    # 1 GiB blocks, 2.5 GiB for Ferry: two slots fit, not five.
    net = NetworkFacts("m", "model", 8 * GIB, (GIB,) * 8, reads_per_prompt=20)
    machine = gpu(4.5, 64, 40, compute_gbps=20.0, disk_gbps=1.0, disk_measured=True)
    c = plan_graph(machine, [net]).choices[0]
    assert (c.prefetch_depth + 1) * c.sizing.group_bytes <= 2.5 * GIB
    assert c.prefetch_depth == 1 and c.blocks_per_group == 1


def test_user_values_are_kept() -> None:
    net = dm(12, wish=Wish(tier="ram", blocks_per_group=3, prefetch_depth=2))
    c = plan_graph(gpu(8, 64, 40), [net]).choices[0]
    assert (c.tier, c.blocks_per_group, c.prefetch_depth) == ("ram", 3, 2)
    assert c.reason.startswith("ram: set on its node")


def test_forced_pinned_above_the_pin_limit_is_refused_naming_tier() -> None:
    plan = plan_graph(gpu(8, 64, 10), [te(), dm(wish=Wish(tier="pinned"))])
    assert not plan.fits
    with pytest.raises(ConfigError) as e:
        plan.check()
    assert e.value.setting == "tier"
    assert "pin limit is 10.00 GiB" in str(e.value) and "auto or ram" in str(e.value)


def test_forced_pinned_on_a_cpu_is_plain_ram_and_not_refused() -> None:
    assert plan_graph(cpu(64, pin_limit=GIB), [dm(wish=Wish(tier="pinned"))]).fits


def test_forced_disk_in_a_folder_too_small_is_refused_naming_disk_path() -> None:
    plan = plan_graph(cpu(64, disk_gib=4), [dm(wish=Wish(tier="disk"))])
    with pytest.raises(ConfigError) as e:
        plan.check()
    assert e.value.setting == "disk_path"
    assert "/nvme/ferry has 4.00 GiB free" in str(e.value) and "12.00 GiB" in str(e.value)


def test_forced_disk_read_in_place_needs_no_room() -> None:
    plan = plan_graph(cpu(64, disk_gib=0), [dm(wish=Wish(tier="disk"), in_place=True)])
    assert plan.fits and plan.disk_bytes == 0


def test_forced_ram_beyond_the_ram_warns_without_refusing() -> None:
    # RAM short of the headroom may still hold: the pre-flight says so, the node runs.
    plan = plan_graph(cpu(8), [dm(wish=Wish(tier="ram"))])
    assert not plan.fits and plan.refusal is None and plan.check() is plan
    assert plan.verdict().startswith("may not fit: the networks need 12.")
    assert "set their tier to auto or disk" in plan.verdict()


def test_nothing_fits_in_ram_without_a_disk_folder_says_what_to_change() -> None:
    plan = plan_graph(cpu(8, disk_gib=None), [te(), dm()])
    assert [c.tier for c in plan.choices] == ["ram", "ram"]  # disk cannot take them
    assert not plan.fits and plan.warning is not None
    assert "give a disk folder with room (disk_path)" in plan.warning
    assert plan.as_dict()["warning"] == plan.warning


def test_in_place_networks_go_to_disk_without_a_folder() -> None:
    plan = plan_graph(cpu(8, disk_gib=None), [te(in_place=True), dm(in_place=True)])
    assert plan.fits and [c.tier for c in plan.choices] == ["disk", "disk"]


def test_bad_wish_is_refused_by_name() -> None:
    with pytest.raises(ConfigError) as e:
        plan_graph(cpu(64), [dm(wish=Wish(prefetch_depth=9))])
    assert e.value.setting == "prefetch_depth"


def test_peak_ram_prediction_adds_up() -> None:
    plan = plan_graph(cpu(20), [te(), dm()], process_ram=GIB)
    slots = sum(c.sizing.slot_bytes for c in plan.choices)
    assert plan.peak_ram == GIB + 12 * GIB + slots
    assert plan.disk_bytes == 9 * GIB
    d = plan.as_dict()
    assert d["fits"] and d["networks"][0]["disk_read_per_prompt"] == 9 * GIB


def test_network_from_file_reads_the_header_only(tmp_path: Path) -> None:
    # 40 blocks of 2 x 4 x 8192^2 bf16 (512 MiB each): 20 GiB declared, a hole on disk.
    path = sparse_safetensors(tmp_path / "dit.safetensors", dit_tensors(40, 8192))
    with bytes_read() as n:
        net = network_from_file(path, name="dit", kind="model", reads_per_prompt=20)
    assert n[0] < 64 * 1024  # the header (~5 KiB) and the open's own reads, not a block
    block = 2 * 4 * 8192 * 8192 * 2 + 8192 * 4
    assert net.block_bytes == (block,) * 40 and net.longest_list == 40
    assert net.nbytes == 40 * block + 2 * 64 * 8192 * 2
    assert net.in_place and net.file == str(path)


def test_network_from_file_cast_and_prefix(tmp_path: Path) -> None:
    tensors = {**dit_tensors(3, 64, prefix="model.diffusion_model."), **{
        "first_stage_model.w": ("F32", (16, 16)),
        "cond.transformer.encoder.layers.0.mlp.w": ("F16", (8, 8)),
        "cond.transformer.encoder.layers.1.mlp.w": ("F16", (8, 8)),
    }}  # fmt: skip
    path = sparse_safetensors(tmp_path / "ckpt.safetensors", tensors)
    net = network_from_file(
        path, name="m", kind="model", prefix="model.diffusion_model.", cast=torch.float32
    )
    block = 2 * 4 * 64 * 64 * 4 + 64 * 4  # bf16 loaded as float32: twice the stored bytes
    assert net.block_bytes == (block,) * 3
    assert not net.in_place  # cast: the disk tier writes its own group files
    te_net = network_from_file(path, name="t", kind="text_encoder", prefix="cond.")
    assert te_net.block_bytes == (128, 128) and te_net.in_place


def test_network_from_file_refuses_a_bad_file_naming_the_setting(tmp_path: Path) -> None:
    bad = tmp_path / "x.safetensors"
    bad.write_bytes(b"\x01" * 4)
    with pytest.raises(ConfigError) as e:
        network_from_file(bad, name="x", kind="model", setting="unet_name")
    assert e.value.setting == "unet_name"


def test_disk_speed_is_assumed_until_recorded(tmp_path: Path) -> None:
    assert disk_speed.cached(str(tmp_path)) == (ASSUMED_DISK_GBPS, False)
    assert disk_speed.record(str(tmp_path), 1.93)
    assert disk_speed.cached(str(tmp_path)) == (1.93, True)
    assert not disk_speed.record(str(tmp_path / "missing"), 2.0)
    (tmp_path / disk_speed.FILE).write_text("{broken")
    assert disk_speed.cached(str(tmp_path)) == (ASSUMED_DISK_GBPS, False)


def test_read_machine_reads_this_machine(tmp_path: Path) -> None:
    disk_speed.record(str(tmp_path), 3.0)
    m = read_machine(vram_free=None, disk_folder=str(tmp_path), ram_budget=GIB)
    assert m.ram_available > 0 and m.disk_free is not None and m.disk_free > 0
    assert (m.disk_gbps, m.disk_measured) == (3.0, True)
    assert m.pin_limit is None  # a CPU pins nothing
    gpu_m = read_machine(vram_free=8 * GIB, disk_folder=str(tmp_path / "a" / "file\x00"))
    assert gpu_m.disk_free is None and gpu_m.pin_limit is not None and gpu_m.pin_limit > 0


@pytest.mark.parametrize(
    ("platform", "ram_gib", "pin_gib"),
    [("win32", 32, 12.8), ("linux", 32, 28.0), ("linux", 8, 4.0), ("linux", 128, 115.2)],
)
def test_default_pin_limit_follows_core(platform: str, ram_gib: int, pin_gib: float) -> None:
    assert default_pin_limit(ram_gib * GIB, platform) == pytest.approx(pin_gib * GIB, abs=1)


def test_a_network_no_ferry_node_offloads_stays_in_ram_and_takes_its_room() -> None:
    plain = te(ferry=False)
    plan = plan_graph(cpu(20), [plain, dm()])
    assert [c.tier for c in plan.choices] == ["ram", "disk"]
    assert plan.choices[0].reason.startswith("ram: not behind a Ferry node")
    assert plan.choices[0].sizing.slot_bytes == 0
    short = plan_graph(cpu(6), [plain, dm()])
    assert short.refusal is None and short.warning is not None
    assert "put the networks no Ferry node offloads behind one" in short.warning


def test_network_from_file_cast_rule_sees_the_files_dtype_and_size(tmp_path: Path) -> None:
    path = sparse_safetensors(tmp_path / "m.safetensors", dit_tensors(2, 64))
    asked: list[tuple[torch.dtype, int]] = []

    def rule(stored: torch.dtype, params: int) -> torch.dtype:
        asked.append((stored, params))
        return torch.float16

    net = network_from_file(path, name="m", kind="model", cast=rule)
    params = 2 * (2 * 4 * 64 * 64 + 64) + 2 * 64 * 64
    assert asked == [(torch.bfloat16, params)]
    assert net.nbytes == params * 2 and not net.in_place  # the F32 scales become fp16


def test_a_vram_budget_on_a_cpu_keeps_groups_on_the_onload_device() -> None:
    # As model/plan.py reads a numeric budget on a CPU: those bytes stay put, the rest streams.
    net = NetworkFacts("m", "model", 8 * GIB, (GIB,) * 8, reads_per_prompt=20)
    c = plan_graph(cpu(64, vram_budget=5 * GIB), [net]).choices[0]
    assert c.sizing.slot_bytes <= 5 * GIB and 0 < c.vram_resident <= 5 * GIB - c.sizing.slot_bytes
    assert "stays on the onload device (the VRAM budget)" in c.reason
    whole = plan_graph(cpu(64, vram_budget=9 * GIB), [net]).choices[0]
    assert whole.vram_resident == 8 * GIB and "whole while it runs" in whole.reason
    assert plan_graph(cpu(64), [net]).choices[0].vram_resident == 0


def test_weights_outside_the_blocks_are_ram_on_a_cpu_whatever_the_tier() -> None:
    # A T5's 1 GiB embedding lies outside its blocks: on a CPU it is RAM even on the disk tier.
    net = NetworkFacts("t5", "text_encoder", 9 * GIB, (GIB // 3,) * 24, in_place=True)
    on_disk = plan_graph(cpu(4), [net])
    (c,) = on_disk.choices
    assert on_disk.fits and net.outside_bytes == 9 * GIB - 24 * (GIB // 3)
    assert c.tier == "disk" and c.ram_bytes == net.outside_bytes + c.sizing.slot_bytes
    assert not plan_graph(cpu(3), [net]).fits  # 1 GiB of room: less than the embedding
    in_ram = plan_graph(cpu(64), [net]).choices[0]
    assert in_ram.tier == "ram" and in_ram.ram_bytes == 9 * GIB + in_ram.sizing.slot_bytes
    assert plan_graph(gpu(4, 64, 40), [net]).choices[0].ram_bytes == 9 * GIB


@pytest.mark.parametrize(
    ("available", "headroom"), [(2 * GIB, 512 << 20), (8 * GIB, GIB), (64 * GIB, 2 * GIB)]
)
def test_default_ram_headroom(available: int, headroom: int) -> None:
    assert default_ram_headroom(available) == headroom


def test_network_from_module_counts_a_meta_module_by_its_shapes() -> None:
    from offload_core.model.demo import DemoDiT
    from offload_core.planner.network_module import network_from_module

    with torch.device("meta"):
        model = DemoDiT(64, 1, 3, 6)
    net = network_from_module(model, "demo", "model", reads_per_prompt=4)
    assert net.held_bytes == 0 and net.longest_list == 6 and len(net.block_bytes) == 9
    assert net.nbytes == sum(p.numel() * 4 for p in model.parameters())
    assert 0 < net.outside_bytes < net.nbytes
    real = network_from_module(
        torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(4, 4))] * 1), "x", "model"
    )
    assert real.held_bytes == real.nbytes and real.block_bytes == ()


def test_the_panels_test_model_is_planned_without_building_it(tmp_path: Path) -> None:
    from offload_core.tools.machine_plan import plan_test_model

    with bytes_read() as n:
        plan = plan_test_model(
            2.0, onload_device="cpu", disk_path=str(tmp_path), vram_budget=None, ram_budget=GIB
        )
    (c,) = plan.choices
    assert n[0] < 1 << 20  # nothing built, nothing read but /proc and the folder's speed file
    assert c.network.nbytes > 1.8 * GIB and c.tier == "disk"  # 1 GiB of RAM budget
    assert c.reason.startswith("disk: ") and "(assumed)" in c.reason


def test_the_files_block_lists_are_the_ones_grouping_cuts(tmp_path: Path) -> None:
    """A ControlNet's shape: composite blocks beside a longer list of Linears (its zero
    outputs) and a Sequential of convs. The file's longest list bounds blocks_per_group, so it
    must be grouping's (offload_core/model/grouping.py), or the plan asks for more."""
    from safetensors.torch import save_file

    from offload_core.model.grouping import BlockLevel, build_grouping

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = torch.nn.Linear(8, 8)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU())

    class Control(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hint = torch.nn.Sequential(*(m for _ in range(4) for m in (
                torch.nn.Conv2d(4, 4, 3), torch.nn.SiLU())))  # fmt: skip
            self.blocks = torch.nn.ModuleList(Block() for _ in range(3))
            self.zero_outs = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(6))

    net = Control()
    path = tmp_path / "control.safetensors"
    save_file(net.state_dict(), str(path))
    facts = network_from_file(path, name="cn", kind="controlnet")
    grouping = build_grouping(net, BlockLevel(blocks_per_group=1))
    assert facts.longest_list == grouping.longest_block_list == 3
    assert len(facts.block_bytes) == 3
