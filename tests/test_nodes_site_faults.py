"""Faults while a ControlNet, a model patch or a CLIP vision model is laid out (issue 38: "faults
recover" for every kind), without ComfyUI: the layout goes through ComfyUI's binding
(nodes/patcher/live_layout.py) on a stand-in shaped as core's object for that kind (tests/test_seam_site.py),
as the Ferry patcher's load does (nodes/patcher/load_steps.py lay_out). The disk filling up on a
group's file, or ComfyUI's Cancel raised from the layout's progress bar, leaves the network
plain and usable: every call the host makes gives the plain output (``torch.equal``), nothing
of Ferry's is left (files, the pinned count), and the next prompt lays it out."""

from __future__ import annotations

import errno
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import PACK_NAME, load_pack
from tests.test_seam_site import host_object

load_pack()
site = importlib.import_module(f"{PACK_NAME}.seam.site")
passes = importlib.import_module(f"{PACK_NAME}.seam.passes")
binding_mod = importlib.import_module(f"{PACK_NAME}.nodes.patcher.live_layout")
config = importlib.import_module(f"{PACK_NAME}.nodes.planning.config")
oc = importlib.import_module(f"{PACK_NAME}.offload_core")
store = importlib.import_module(f"{PACK_NAME}.offload_core.disk.store")
errors = importlib.import_module(f"{PACK_NAME}.offload_core.errors")

#: The kinds issue 38 added; the diffusion model's and text encoder's faults have their own
#: tests (tests/test_nodes_recovery.py, tests/test_faults.py).
NEW_SITES = (site.CONTROLNET, site.MODEL_PATCH, site.CLIP_VISION)


class Cancelled(Exception):
    """ComfyUI's InterruptProcessingException: its progress bar raises it on Cancel."""


def cfg(s: Any, tier: str, folder: Path) -> Any:
    policy = config.policy_from_inputs(
        level="block", blocks_per_group=1, tier=tier, disk_path=str(folder),
        prefetch_depth=1, vram_budget="",
    )  # fmt: skip
    return config.ComfyOffload(policy, name="tiny", kind=s.kind)


class Laid:
    """One kind's stand-in object, its network's binding, and the host's calls on it."""

    def __init__(self, s: Any) -> None:
        self.site = s
        obj = host_object(s)
        patcher = s.patcher_of(obj)
        self.net = s.network_of(patcher.model).requires_grad_(False)
        self.binding = binding_mod.ComfyLayout.of(patcher.model, self.net)
        self.pinned: list[int] = []
        self.binding.count_pinned = self.pinned.append  # core's pinned-memory count
        x = torch.randn(2, 8, generator=torch.Generator().manual_seed(3))
        self.calls: dict[str, Callable[[], torch.Tensor]] = {
            "forward": lambda: self.net(x),
            "encode_token_weights": lambda: self.net.encode_token_weights(x),
            "control_block": lambda: self.net.control_block(self.net.embed(x), 1),
        }
        with torch.no_grad():
            self.plain = {m: f() for m, f in self.calls.items()}

    def prepare(self) -> None:
        passes.mark_passes(self.net, self.site.passes)  # load_steps.prepare's step
        return None

    def ensure(self, offload: Any, progress: Any = None) -> bool:
        return self.binding.ensure(offload, "cpu", None, self.prepare, progress)  # type: ignore[no-any-return]

    def assert_plain_output(self) -> None:
        with torch.no_grad():
            for m, f in self.calls.items():
                assert torch.equal(f(), self.plain[m]), m


def assert_nothing_left(laid: Laid, folder: Path) -> None:
    assert not laid.binding.live and oc.find_offload(laid.net) is None
    assert oc.live_offloads() == []
    assert sum(laid.pinned) == 0, "the pinned bytes told to core are given back"
    assert not list(folder.rglob("group-*")), "no group file (nor its .tmp) left"
    assert not any(p.device.type == "meta" for p in laid.net.parameters())


def relaid_and_released(laid: Laid, folder: Path) -> None:
    """The next prompt lays the network out again, and it gives the plain output."""
    assert laid.ensure(cfg(laid.site, "disk", folder))
    assert laid.binding.live and laid.binding.handle.kind is laid.site.kind
    laid.assert_plain_output()
    laid.binding.release()
    laid.assert_plain_output()
    assert oc.live_offloads() == []


@pytest.mark.parametrize("s", NEW_SITES, ids=lambda s: s.kind.value)
def test_the_disk_filling_up_mid_layout_leaves_the_network_usable(
    s: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    laid = Laid(s)
    real, writes = store.atomic_write, []

    def fills_up(path: Path, *args: Any, **kwargs: Any) -> Any:
        if path.name.startswith("group-"):
            writes.append(path.name)
            if len(writes) == 2:  # the first group is on disk, the second does not fit
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(store, "atomic_write", fills_up)
    with pytest.raises(errors.ConfigError, match="the disk filled up") as e:
        laid.ensure(cfg(s, "disk", tmp_path))
    assert e.value.setting == "disk_path" and len(writes) == 2
    assert_nothing_left(laid, tmp_path)
    laid.assert_plain_output()
    monkeypatch.setattr(store, "atomic_write", real)  # room again (the user freed some)
    relaid_and_released(laid, tmp_path)


@pytest.mark.parametrize("tier", ["pinned", "disk"])
@pytest.mark.parametrize("s", NEW_SITES, ids=lambda s: s.kind.value)
def test_cancel_mid_layout_leaves_the_network_usable(s: Any, tier: str, tmp_path: Path) -> None:
    laid = Laid(s)
    seen: list[tuple[int, int]] = []

    def cancel_at_second(done: int, total: int) -> None:
        seen.append((done, total))
        if len(seen) == 2:
            raise Cancelled("interrupted")

    with pytest.raises(Cancelled):
        laid.ensure(cfg(s, tier, tmp_path), cancel_at_second)
    assert len(seen) == 2 and seen[-1][1] > 2, "cancelled with groups still to lay out"
    assert_nothing_left(laid, tmp_path)
    laid.assert_plain_output()
    relaid_and_released(laid, tmp_path)


@pytest.mark.parametrize("s", NEW_SITES, ids=lambda s: s.kind.value)
def test_a_fault_while_planning_moves_nothing(s: Any, tmp_path: Path) -> None:
    # A setting the network cannot take is refused by the plan, before any weight moves.
    laid = Laid(s)
    bad = config.ComfyOffload(
        config.policy_from_inputs(
            level="block", blocks_per_group=64, tier="ram", disk_path="", prefetch_depth=1,
            vram_budget="",
        ),
        name="tiny", kind=s.kind,
    )  # fmt: skip
    with pytest.raises(errors.ConfigError) as e:
        laid.ensure(bad)
    assert e.value.setting == "blocks_per_group"
    assert_nothing_left(laid, tmp_path)
    laid.assert_plain_output()
    relaid_and_released(laid, tmp_path)
