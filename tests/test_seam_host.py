"""A new host is one adapter file plus its registration (tests/seam_test_host.py): through the
seam alone it lays a model out, keeps the layout across the host's clones, and releases it,
with outputs equal to the resident model's. Also the seam's one source-file check, its one
error relabelling, and the choice lists both hosts take from offload_core/policy.py."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests import seam_test_host as adapter
from tests.conftest import PACK_NAME, load_pack

load_pack()
oc = importlib.import_module(f"{PACK_NAME}.offload_core")
policy_mod = importlib.import_module(f"{PACK_NAME}.offload_core.policy")
seam_offload = importlib.import_module(f"{PACK_NAME}.seam.offload")
seam_controls = importlib.import_module(f"{PACK_NAME}.seam.controls")
node_config = importlib.import_module(f"{PACK_NAME}.nodes.planning.config")
forge_controls = importlib.import_module(f"{PACK_NAME}.webui.controls")

CPU = torch.device("cpu")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(32, 32)
        self.b = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 32)
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.out = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x)


class SharedModel:
    """The object every clone of one model shares (ComfyUI's BaseModel, Forge's KModel)."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.diffusion_model = Net().requires_grad_(False)


class HostPatcher:
    """The host's own patcher: a clone shares the model; load moves the network whole."""

    def __init__(self, model: SharedModel) -> None:
        self.model = model
        self.device = CPU

    def clone(self) -> Any:
        return self.__class__(self.model)

    def is_clone(self, other: Any) -> bool:
        return bool(other.model is self.model)

    def load(self) -> None:
        self.model.diffusion_model.to(self.device)

    def unload(self, device: torch.device | None) -> None:
        if device is not None:
            self.model.diffusion_model.to(device)


class TinyHost:
    """The host's loader: before loading a patcher it unloads every other loaded clone of
    the same model without moving it, asking the loading patcher ``is_clone`` first."""

    def __init__(self) -> None:
        self.loaded: list[Any] = []

    def load(self, patcher: Any) -> None:
        for old in list(self.loaded):
            if old is not patcher and patcher.is_clone(old):
                old.unload(None)
                self.loaded.remove(old)
        patcher.load()
        if patcher not in self.loaded:
            self.loaded.append(patcher)

    def free(self) -> None:
        for p in self.loaded:
            p.unload(CPU)
        self.loaded.clear()


class PackPatcher(HostPatcher):
    """A pack's patcher whose clone is of its own class whatever the source's was, as
    ComfyUI-GGUF's GGUFModelPatcher.clone sets ``__class__`` back."""

    def clone(self) -> Any:
        n = super().clone()
        n.__class__ = PackPatcher
        return n


X = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))


def _policy(tier: str, tmp_path: Path, **kw: Any) -> Any:
    flat = {"level": "block", "blocks_per_group": 2, "tier": tier, "prefetch_depth": 1}
    flat["disk_path"] = str(tmp_path / "groups") if tier == "disk" else None
    flat.update(kw)
    return policy_mod.OffloadPolicy.from_dict(flat)


@pytest.mark.parametrize("tier", ["pinned", "ram", "disk"])
def test_a_new_host_lays_out_keeps_and_releases_through_the_seam(tier: str, tmp_path: Path) -> None:
    model = SharedModel()
    net = model.diffusion_model
    with torch.no_grad():
        ref = net(X)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    host, plain = TinyHost(), HostPatcher(model)
    ferry = adapter.ferry_clone(plain, _policy(tier, tmp_path))
    host.load(ferry)
    layout = adapter.TinyHostLayout.of(model)
    assert layout.live and oc.find_offload(net) is layout.handle
    with torch.no_grad():
        assert torch.equal(net(X), ref)
    first = layout.handle
    # The host clones the patcher (a node, a script): the clone keeps Ferry and the layout.
    again = ferry.clone()
    assert isinstance(again, adapter.FerryVerbs)
    host.load(again)
    with torch.no_grad():
        assert torch.equal(net(X), ref)
    assert layout.handle is first and first.stats().forwards == 2
    # Another offload lays the model out again; a plain clone gets the plain network back.
    host.load(adapter.ferry_clone(plain, _policy(tier, tmp_path, prefetch_depth=2)))
    assert first.removed and layout.handle.policy.prefetch_depth == 2
    host.load(plain.clone())
    assert not layout.live and oc.live_offloads() == []
    assert layout.events == ["laid out", "released", "laid out", "released"]
    after = net.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    with torch.no_grad():
        assert torch.equal(net(X), ref)


def test_a_plan_on_the_twin_checks_before_anything_moves(tmp_path: Path) -> None:
    model = SharedModel()
    layout = adapter.TinyHostLayout.of(model)
    bad = seam_offload.HeldOffload(_policy("ram", tmp_path, blocks_per_group=9), "net")
    with pytest.raises(oc.GroupingError) as info:
        layout.plan(bad, CPU)
    assert info.value.setting == "blocks_per_group"
    with pytest.raises(oc.GroupingError):
        layout.ensure(bad, CPU, None, lambda: pytest.fail("prepared before the check"))
    assert not layout.live and layout.events == []
    good = seam_offload.HeldOffload(_policy("ram", tmp_path), "net")
    planned = layout.plan(good, CPU)
    assert all(t.device.type == "meta" for t in layout.twin_plans().basis.parameters())
    layout.ensure(good, CPU, None, lambda: None)
    # A plan of another offload leaves the live layout alone (it is drawn on the twin).
    assert layout.plan(good, CPU) is layout.handle.plan
    assert layout.handle.plan.device_bytes == planned.device_bytes
    layout.plan(seam_offload.HeldOffload(_policy("ram", tmp_path, prefetch_depth=2), "net"), CPU)
    assert layout.live
    layout.release()


def test_the_source_file_check_is_one_for_every_host(tmp_path: Path) -> None:
    disk = seam_offload.HeldOffload(_policy("disk", tmp_path), "net")
    ram = seam_offload.HeldOffload(_policy("ram", tmp_path), "net")
    for suffix in (".safetensors", ".gguf"):
        f = tmp_path / f"model{suffix}"
        f.write_bytes(b"")
        assert disk.with_source_checkpoint(str(f)).policy.tier.source_checkpoint == str(f)
        assert ram.with_source_checkpoint(str(f)) == ram
    ckpt = tmp_path / "model.ckpt"
    ckpt.write_bytes(b"")
    for path in (str(ckpt), str(tmp_path / "gone.safetensors"), None, ""):
        assert disk.with_source_checkpoint(path) == disk
    # Both hosts' offloads are the seam's, so they take the same check.
    assert issubclass(node_config.ComfyOffload, seam_offload.HeldOffload)
    assert issubclass(forge_controls.ForgeOffload, seam_offload.HeldOffload)


def test_each_host_names_its_own_control_for_one_setting() -> None:
    err = oc.ConfigError("vram_budget_gb", "must be a number of GB, got 'x'")
    node = node_config.as_node_error(err)
    forge = forge_controls.as_control_error(err)
    assert (node.input_name, node.message) == ("vram_budget", "must be a number of GB, got 'x'")
    assert (forge.control, forge.message) == ("vram_budget", "must be a number of GB, got 'x'")
    headroom = oc.ConfigError("headroom_gb", "must be >= 0")
    assert node_config.as_node_error(headroom).input_name == "headroom_gb"
    shown = forge_controls.as_control_error(headroom)  # no such control in Forge's accordion
    assert shown.control == "use_saved" and shown.message == "headroom_gb: must be >= 0"
    saved = node_config.as_node_error(err, panel=True)
    assert saved.input_name == "use_panel_settings" and "'vram_budget_gb'" in saved.message


def test_the_choice_lists_come_from_the_policy() -> None:
    assert policy_mod.TIER_NAMES == ("pinned", "ram", "shared", "disk")
    assert policy_mod.LEVEL_NAMES == ("block", "leaf")
    for host in (node_config, forge_controls):
        assert host.TIERS is policy_mod.TIER_NAMES and host.LEVELS is policy_mod.LEVEL_NAMES


def test_a_packs_clone_keeps_ferry_through_the_seams_clone(tmp_path: Path) -> None:
    """The seam's clone (FerryClones, both hosts' and this adapter's) puts Ferry's class back
    in front of the pack's and shares the offload; its is_clone marks the layout loading, so
    the host's unload of the old clone keeps it."""
    model = SharedModel()
    with torch.no_grad():
        ref = model.diffusion_model(X)
    host = TinyHost()
    ferry = adapter.ferry_clone(PackPatcher(model), _policy("ram", tmp_path))
    host.load(ferry)
    again = ferry.clone()
    assert isinstance(again, adapter.FerryVerbs) and isinstance(again, PackPatcher)
    assert again.ferry_offload is ferry.ferry_offload
    host.load(again)
    layout = adapter.TinyHostLayout.of(model)
    assert layout.events == ["laid out"] and layout.live  # kept across the clone
    with torch.no_grad():
        assert torch.equal(model.diffusion_model(X), ref)
    host.free()
    assert layout.events == ["laid out", "released"] and not layout.live
