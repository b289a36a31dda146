"""The shared RAM tier (offload_core/disk/shared_segments.py: [Note: one copy across
processes]): identical networks in two processes map the same bytes, different ones never do;
the holder count survives kill -9; a crash's leftovers are swept at the next start; a writer
killed mid-fill leaves nothing mappable; files are 0600. Processes are started with
multiprocessing's spawn, as separate ComfyUI servers are. The schedule's ordering is checked
under the sanitizer engine (tests/sanitizer_backend.py), as the other tiers'."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import stat
from pathlib import Path
from typing import Any

import pytest
import torch

from offload_core import BlockLevel, ConfigError, OffloadPolicy, SharedRamTier, apply_offload
from offload_core import api as apply_mod
from offload_core.disk import shared_segments
from offload_core.disk.shared_segments import PARTIAL, SEGMENT, SharedNamespace, segment_key
from offload_core.model.demo import demo_inputs
from offload_core.sources.shared_slab import SharedSlabSource
from tests.sanitizer_backend import ComputeKernels, SanitizerBackend
from tests.shared_tier_child import die_mid_fill, hold_file, holder, model_for, sources_of

pytestmark = pytest.mark.skipif(os.name == "nt", reason="the shared tier is POSIX only")


def _segments(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.suffix == SEGMENT)


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh namespace folder for this test (children find it through the environment)."""
    folder = tmp_path / "shared"
    monkeypatch.setenv("FERRY_SHARED_DIR", str(folder))
    monkeypatch.setattr(shared_segments, "_namespaces", {})
    return folder


# ---- one process --------------------------------------------------------------------------


def test_offloaded_equals_resident_and_nothing_is_left(root: Path) -> None:
    model = model_for()
    x = demo_inputs(model, tokens=8)
    with torch.no_grad():
        ref = model(**x)
    handle = apply_offload(model, OffloadPolicy(tier=SharedRamTier()), onload_device="cpu")
    sources = sources_of(handle)
    assert sources and all(isinstance(s, SharedSlabSource) for s in sources)
    assert all(s.held.made and s.held.others == 0 for s in sources)
    assert len(_segments(root)) == len({s.held.key for s in sources})
    assert any("shared tier: " in n for n in handle._placement.notes)
    with torch.no_grad():
        assert torch.equal(model(**x), ref)
    handle.remove()
    with torch.no_grad():
        assert torch.equal(model(**x), ref)
    assert _segments(root) == []
    shared_segments.namespace().release_all()
    assert list(root.iterdir()) == []  # nothing left in the namespace


def test_files_are_private_to_the_user(root: Path) -> None:
    ns = shared_segments.namespace()
    held = ns.hold(torch.arange(1000, dtype=torch.float32))
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    for p in root.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p.name
    ns.release(held)
    ns.release_all()


def test_a_folder_open_to_others_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "open"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    with pytest.raises(ConfigError, match=r"tier.*0700"):
        SharedNamespace(folder).hold(torch.zeros(8))


def test_policy_round_trip() -> None:
    policy = OffloadPolicy.from_dict({"tier": "shared"})
    assert isinstance(policy.tier, SharedRamTier) and policy.tier_name == "shared"
    assert OffloadPolicy.from_dict(policy.to_dict()) == policy
    with pytest.raises(ConfigError, match="tier"):
        OffloadPolicy.from_dict({"tier": "sharde"})


# ---- the sanitizer engine -------------------------------------------------------------------


@pytest.mark.parametrize("slow", [None, "copy", "host"])
def test_shared_tier_has_no_race(root: Path, monkeypatch: pytest.MonkeyPatch, slow: Any) -> None:
    """The views registered for pinned copies go the pinned tier's way (direct copies, its
    waits), with no race, whichever side is slow; unregistered before they are let go."""
    backend = SanitizerBackend(slow=slow, delay=0.003)
    monkeypatch.setattr(apply_mod, "backend_for", lambda device: backend)
    model = model_for()
    x = demo_inputs(model, tokens=8)
    with torch.no_grad():
        ref = model(**x)
    policy = OffloadPolicy(level=BlockLevel(1), tier=SharedRamTier(), prefetch_depth=2)
    handle = apply_offload(model, policy, onload_device="cpu")
    assert all(s.pinned for s in sources_of(handle))
    assert backend.registered_views == len(sources_of(handle))
    try:
        with torch.no_grad(), ComputeKernels(backend):
            outs = [model(**x) for _ in range(3)]
    finally:
        handle.remove()
    assert backend.errors == [], "\n".join(map(str, backend.errors[:3]))
    assert all(torch.equal(o, ref) for o in outs)
    assert backend.waits["compute-waits-copy"] > 20
    assert backend.registered_views == 0


@pytest.mark.parametrize("drop", ["copy-waits-compute", "compute-waits-copy"])
def test_checker_has_teeth_on_the_shared_tier(
    root: Path, monkeypatch: pytest.MonkeyPatch, drop: str
) -> None:
    backend = SanitizerBackend(drop)
    monkeypatch.setattr(apply_mod, "backend_for", lambda device: backend)
    model = model_for()
    x = demo_inputs(model, tokens=8)
    policy = OffloadPolicy(level=BlockLevel(1), tier=SharedRamTier(), prefetch_depth=2)
    handle = apply_offload(model, policy, onload_device="cpu")
    try:
        with torch.no_grad(), ComputeKernels(backend):
            for _ in range(2):
                model(**x)
    finally:
        handle.remove()
    assert backend.errors, f"removing {drop} went unnoticed"


# ---- across processes -------------------------------------------------------------------------


class Holder:
    def __init__(self, seed: int = 1, lora: float = 0.0) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=holder, args=(child, seed, lora), daemon=True)
        self.proc.start()
        assert self.conn.poll(600), "the holder did not lay out in time"
        self.info: dict[str, Any] = self.conn.recv()

    def ask(self, cmd: str) -> Any:
        self.conn.send(cmd)
        assert self.conn.poll(300)
        return self.conn.recv()

    def stop(self) -> None:
        if self.proc.is_alive():
            self.conn.send("exit")
        self.proc.join(30)

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(30)


def test_two_processes_map_the_same_bytes_and_survive_kill9(root: Path) -> None:
    a = Holder()
    b = Holder()
    try:
        assert all(a.info["made"]) and not any(b.info["made"])
        assert b.info["keys"] == a.info["keys"] and b.info["others"] == 1
        # The same files (same inodes) in both, and one segment per group, not two.
        assert a.info["mapped"] == b.info["mapped"]
        assert len(a.info["mapped"]) == len(set(a.info["keys"])) == len(_segments(root))
        a.kill9()
        # The segments outlive the killed writer while b maps them; b computes on.
        assert len(_segments(root)) == len(set(b.info["keys"]))
        assert b.ask("forward") is True
        assert b.ask("remove") is True  # the last one out removes them
        assert _segments(root) == []
    finally:
        a.stop()
        b.stop()
    # b exited normally: its holder file went with it; a's (killed) is swept at the next start.
    ns = SharedNamespace(root)
    ns.holders_of("x")
    assert [p for p in root.iterdir() if p.name != ns._holder_name] == []
    ns.release_all()
    assert list(root.iterdir()) == []


def test_a_crash_leftover_is_swept_at_the_next_start(root: Path) -> None:
    a = Holder()
    b = Holder()
    a.kill9()
    b.kill9()
    left = _segments(root)
    assert len(left) == len(set(a.info["keys"]))  # all holders died: nobody removed them
    ns = SharedNamespace(root)
    held = ns.hold(torch.ones(16))  # the next process's first use
    assert set(left) <= set(ns.swept)
    assert _segments(root) == [f"{held.key}{SEGMENT}"]
    ns.release(held)
    ns.release_all()
    assert list(root.iterdir()) == []


def test_different_loras_never_share_the_changed_groups(root: Path) -> None:
    a = Holder(lora=0.01)
    b = Holder(lora=0.02)
    try:
        changed = [i for i, (ka, kb) in enumerate(zip(a.info["keys"], b.info["keys"])) if ka != kb]
        assert changed, "the two LoRAs gave the same bytes"
        assert all(b.info["made"][i] for i in changed)  # made anew, never mapped from a's
        assert not set(a.info["keys"][i] for i in changed) & set(b.info["keys"][i] for i in changed)
        # The groups no LoRA changed are still shared.
        assert not all(b.info["made"])
        assert a.ask("forward") is True and b.ask("forward") is True
    finally:
        a.stop()
        b.stop()


def test_a_writer_killed_mid_fill_leaves_nothing_mappable(root: Path) -> None:
    n = 1 << 16
    proc = mp.get_context("spawn").Process(target=die_mid_fill, args=(str(root), n))
    proc.start()
    proc.join(600)
    assert proc.exitcode == -signal.SIGKILL
    data = torch.arange(n, dtype=torch.float32)
    key = segment_key(data)
    assert not (root / f"{key}{SEGMENT}").exists()  # never complete under the mapped name
    assert (root / f"{key}{PARTIAL}").exists()
    ns = SharedNamespace(root)
    held = ns.hold(data)
    assert held.made and torch.equal(held.data.view(torch.float32), data)
    assert not (root / f"{key}{PARTIAL}").exists()
    ns.release(held)
    ns.release_all()


def test_a_changed_file_is_never_served_stale(root: Path, tmp_path: Path) -> None:
    """One process holds the weights of a file; the file changes on disk (same size); a
    second process loading it gets the new bytes, never the first one's segment."""
    from safetensors.torch import load_file, save_file

    path = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(4096)}, path)
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=hold_file, args=(child, str(path)), daemon=True)
    proc.start()
    try:
        assert conn.poll(600)
        old_key = conn.recv()
        save_file({"w": torch.full((4096,), 0.5)}, path)
        new = load_file(path)["w"]
        ns = shared_segments.namespace()
        held = ns.hold(new)
        assert held.key != old_key and held.made and held.others == 0
        assert torch.equal(held.data.view(torch.float32), new)
        ns.release(held)
    finally:
        conn.send("exit")
        proc.join(30)


def test_windows_is_refused_naming_the_tier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No flock on Windows: the tier says so and names the choice to make instead."""
    monkeypatch.setattr(shared_segments.sys, "platform", "win32")
    with pytest.raises(ConfigError, match="tier: the shared tier needs POSIX file locks"):
        SharedNamespace(tmp_path / "ns").hold(torch.zeros(8))
