"""The CPU disk path that computes straight from the group files' mapping (offload_core/disk/mapped.py), and
when the chunk checksums are checked ([Note: what is checked when] in disk/plan.py)."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest
import torch

from offload_core import (
    BlockLevel,
    CorruptGroupFileError,
    DiskTier,
    LeafLevel,
    OffloadPolicy,
    apply_offload,
)
from offload_core.disk import plan as reads
from offload_core.disk.mapped import MappedSource, can_map, choose_cpu_read
from offload_core.disk.plan import FileIdentity
from offload_core.sources import lay_out
from tests.helpers import flip_byte, make_model, reference

pytestmark = pytest.mark.skipif(not can_map(), reason="mapped groups need Linux madvise")


def _mapped_rss(folder: Path) -> int:
    """Bytes of the group files this process has mapped in right now (/proc/self/smaps)."""
    total, counting = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5:  # a mapping's first line
                counting = len(head) >= 6 and head[5].startswith(str(folder))
            elif counting and head[0] == "Rss:":
                total += int(head[1]) * 1024
    return total


@pytest.mark.parametrize("level", [BlockLevel(1), LeafLevel()])
@pytest.mark.parametrize("depth", [1, 2])
def test_only_the_window_is_mapped_and_no_slot_is_allocated(tmp_path, level, depth):
    x, ref = reference("fp32")
    model = make_model("fp32")
    policy = OffloadPolicy(
        level=level, tier=DiskTier(str(tmp_path), cpu_read="mapped"), prefetch_depth=depth
    )
    handle = apply_offload(model, policy, onload_device="cpu")
    engine = handle._engine
    assert engine is not None and engine.transfers.ring is None, "a mapped group needs no slot"
    assert all(isinstance(g.source, MappedSource) for g in engine.groups)
    largest = max(g.spec.nbytes for g in engine.groups)
    total = sum(g.spec.nbytes for g in engine.groups)
    seen: list[int] = []
    hooks = [
        m.register_forward_hook(lambda *a: seen.append(_mapped_rss(tmp_path)))
        for g in engine.groups
        for _, m in g.spec.modules
    ]
    try:
        with torch.no_grad():
            for _ in range(3):
                assert torch.equal(model(**x), ref)
                seen.append(_mapped_rss(tmp_path))
    finally:
        for h in hooks:
            h.remove()
    # While a group computes, it and the groups prefetched after it are mapped, nothing more:
    # the ring's bytes ((depth + 1) x the largest group), plus up to two pages per group
    # mapped (a group's first and last page can hold its neighbours' bytes).
    bound = (depth + 1) * largest + (engine.schedule.max_window + 1) * 8192
    assert max(seen) <= bound < total, (max(seen), bound, total)
    assert max(seen) >= largest // 2, "the pages really were mapped while computing"
    handle.remove()
    assert _mapped_rss(tmp_path) == 0


def _count_crc(monkeypatch) -> list[int]:
    calls = [0]
    real = zlib.crc32

    def crc32(data, *a):
        calls[0] += 1
        return real(data, *a)

    monkeypatch.setattr(reads.zlib, "crc32", crc32)
    return calls


@pytest.mark.parametrize("cpu_read", ["mapped", "copy"])
@pytest.mark.parametrize("verify", ["first_read", "every_read"])
def test_checksums_first_read_or_every_read(tmp_path, monkeypatch, cpu_read, verify):
    x, ref = reference("fp32")
    model = make_model("fp32")
    tier = DiskTier(str(tmp_path), verify=verify, cpu_read=cpu_read)
    handle = apply_offload(model, OffloadPolicy(tier=tier), onload_device="cpu")
    chunks = sum(len(g.source.file_plan.chunks) for g in handle._engine.groups)
    calls = _count_crc(monkeypatch)
    per_forward = []
    with torch.no_grad():
        for _ in range(3):
            calls[0] = 0
            assert torch.equal(model(**x), ref)
            per_forward.append(calls[0])
    handle.remove()
    # The wrap-around prefetch reads the next forward's first group at the end of this one.
    if verify == "first_read":
        assert per_forward[0] >= chunks - 2 and per_forward[1:] == [0, 0]
    else:
        assert all(n >= chunks - 2 for n in per_forward)


def test_rot_under_an_unchanged_identity_is_caught_by_every_read(tmp_path):
    """Media that rots without touching the file's metadata: only every_read can see it.
    (Simulated by recording the identity after the flip.)"""
    x, ref = reference("fp32")
    model = make_model("fp32")
    tier = DiskTier(str(tmp_path), verify="every_read", cpu_read="mapped")
    handle = apply_offload(model, OffloadPolicy(tier=tier), onload_device="cpu")
    with torch.no_grad():
        assert torch.equal(model(**x), ref)
    g = handle._engine.groups[2]
    flip_byte(g.source.file_plan.path)
    g.source.file_plan.identity = FileIdentity.of(os.stat(g.source.file_plan.path))
    with torch.no_grad(), pytest.raises(CorruptGroupFileError, match="checksum"):
        model(**x)
    handle._placement.store = None  # keep the evidence out of remove()'s way
    with pytest.raises(CorruptGroupFileError):
        handle.remove()


def test_a_write_while_the_group_computes_fails_the_forward(tmp_path):
    """Mapped groups compute on the page cache: a write to the file during the group's
    forward is caught when the group is released, so the forward raises instead of
    returning what it computed from changed bytes."""
    x, ref = reference("fp32")
    model = make_model("fp32")
    tier = DiskTier(str(tmp_path), cpu_read="mapped")
    handle = apply_offload(model, OffloadPolicy(tier=tier), onload_device="cpu")
    g = handle._engine.groups[1]
    target = g.source.file_plan.path
    state = {"armed": True, "byte": 0}

    def tamper(*args):
        if state["armed"]:
            state["armed"] = False
            state["byte"] = flip_byte(target)

    hook = g.spec.modules[0][1].register_forward_pre_hook(tamper)
    with torch.no_grad(), pytest.raises(CorruptGroupFileError, match="checksum"):
        model(**x)
    hook.remove()
    with open(target, "r+b") as f:  # put the byte back: the same bytes, a new identity
        f.seek(-1000, os.SEEK_END)
        f.write(bytes([state["byte"]]))
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(model(**x), ref)
    handle.remove()


# -- cpu_read="auto": the rule, on fixed inputs, then both of its answers end to end --------
GIB = 1 << 30


@pytest.mark.parametrize(
    ("asked", "slots", "available", "chosen"),
    [
        ("auto", 1 * GIB, 16 * GIB, "copy"),  # slots are a small share of free RAM
        ("auto", 4 * GIB, 16 * GIB, "copy"),  # exactly the share: still copy
        ("auto", 4 * GIB + 1, 16 * GIB, "mapped"),  # RAM is the constraint
        ("auto", 1 * GIB, None, "mapped"),  # unknown RAM: the side that holds none
        ("mapped", 1, 16 * GIB, "mapped"),  # asked for explicitly: never overridden
        ("copy", 64 * GIB, 1 * GIB, "copy"),
    ],
)
def test_cpu_read_rule(asked, slots, available, chosen):
    assert choose_cpu_read(asked, slots, available) == chosen


@pytest.mark.parametrize(("available", "kind"), [(1 << 50, "slot"), (1, "mapped")])
def test_auto_takes_the_path_the_rule_chose_and_stays_exact(tmp_path, monkeypatch, available, kind):
    monkeypatch.setattr(lay_out, "available_ram", lambda: available)
    x, ref = reference("fp32")
    model = make_model("fp32")
    handle = apply_offload(model, OffloadPolicy(tier=DiskTier(str(tmp_path))), onload_device="cpu")
    engine = handle._engine
    assert engine is not None
    mapped = all(isinstance(g.source, MappedSource) for g in engine.groups if g.host_forms)
    assert mapped == (kind == "mapped") and (engine.transfers.ring is None) == mapped
    assert any("cpu_read auto" in n for n in handle.plan.notes + handle._placement.notes)
    with torch.no_grad():
        outs = [model(**x) for _ in range(2)]
    handle.remove()
    assert all(torch.equal(o, ref) for o in outs)


def test_unchecked_reads_join_contiguous_chunks_into_runs(monkeypatch):
    """A read whose checksums are not due is one request per contiguous run (disk/plan.py:
    [Note: what is checked when]); a gap in the file or in the slab, or the size cap, splits."""
    monkeypatch.setattr(reads, "RUN", 48)
    c = reads.Chunk
    plan = reads.ReadPlan(
        Path("x"), -1, reads.FileIdentity(0, 0, 0, 0), [
            c(0, 0, 16, 1), c(16, 16, 16, 2), c(32, 32, 16, 3),  # joined, up to the cap
            c(48, 48, 16, 4),  # the cap starts a new run
            c(80, 64, 16, 5),  # a gap in the file
            c(96, 96, 16, 6),  # a gap in the slab
        ], owned=True,
    )  # fmt: skip
    got = [(r.file_offset, r.buf_offset, r.nbytes) for r in plan.runs]
    assert got == [(0, 0, 48), (48, 48, 16), (80, 64, 16), (96, 96, 16)]
