"""The window read (disk/reader.py, [Note: the window read]): the whole pages around a
group's tensors in a checkpoint, read with O_DIRECT from a real file on a real disk, then
moved to the slab's 64-byte-aligned places; every byte compared with the file."""

from __future__ import annotations

import os
import random
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from offload_core import DiskTier, OffloadPolicy, apply_offload, load_offloaded
from offload_core.disk import reader as window_read
from offload_core.disk.files import platform_backend
from offload_core.disk.host_memory import host_buffer
from offload_core.disk.plan import CHUNK, Chunk, open_plan, window_for
from offload_core.disk.reader import read_window
from offload_core.errors import CorruptGroupFileError
from offload_core.model.demo import DemoDiT
from offload_core.model.layout import align_up
from offload_core.units import PAGE
from tests.helpers import make_model, reference

# Windows' and macOS' Python have no O_DIRECT (their stand-ins neither): the window is read
# only through unbuffered descriptors, so there is no window read to test there.
pytestmark = pytest.mark.skipif(
    not platform_backend().has_direct, reason="no O_DIRECT on this platform: no window reads"
)

KiB = 1 << 10
POOL = ThreadPoolExecutor(2, thread_name_prefix="test-copy-out")


def bounces(nbytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    return host_buffer(nbytes), host_buffer(nbytes)


def packed_file(path: Path, sizes: list[int], lead: int, seed: int) -> list[tuple[int, int]]:
    """A file of random bytes where tensors of ``sizes`` lie back to back after ``lead``
    bytes (a checkpoint's header); returns each tensor's (file offset, nbytes)."""
    rng = random.Random(seed)
    data = bytes(rng.getrandbits(8) for _ in range(lead + sum(sizes) + rng.randrange(0, 9000)))
    path.write_bytes(data)
    spans, at = [], lead
    for n in sizes:
        spans.append((at, n))
        at += n
    return spans


def slab_chunks(path: Path, spans: list[tuple[int, int]]) -> tuple[list[Chunk], int]:
    """The chunks a checkpoint plan has: each tensor at a 64-byte-aligned slab offset, split
    into CHUNK pieces, with its CRC32."""
    data = path.read_bytes()
    chunks, at = [], 0
    for off, n in spans:
        at = align_up(at, 64)
        for o in range(0, n, CHUNK):
            m = min(CHUNK, n - o)
            crc = zlib.crc32(data[off + o : off + o + m])
            chunks.append(Chunk(off + o, at + o, m, crc))
        at += n
    return chunks, at


@pytest.mark.parametrize("seed", range(12))
def test_every_tensor_lands_at_its_slab_offset_with_the_files_bytes(tmp_path, seed):
    """Tensors of every size at every phase, in a slab order unlike the file's (safetensors
    sorts its keys; a slab follows the model), read through a bounce buffer smaller than
    the window, so pieces split tensors."""
    rng = random.Random(seed)
    sizes = [rng.choice([4, 60, 4096, 6144, rng.randrange(1, 300 * KiB)]) for _ in range(9)]
    if seed % 3 == 0:
        sizes.append(CHUNK + 12345)  # a tensor of more than one chunk
    path = tmp_path / "ckpt.bin"
    spans = packed_file(path, sizes, lead=rng.randrange(8, 3 * PAGE), seed=seed)
    rng.shuffle(spans)
    chunks, span = slab_chunks(path, spans)
    plan = open_plan(path, chunks, owned=False, direct=True)
    assert plan.direct_fd >= 0, "this filesystem refuses O_DIRECT: the test needs a real disk"
    window = window_for(plan)
    assert window is not None and window.start % PAGE == 0 and window.end % PAGE == 0
    buf = host_buffer(span)
    buf.fill_(0xAB)
    piece = rng.choice([PAGE, 3 * PAGE, 64 * KiB, 1 << 20])
    bounce, bounce2 = host_buffer(piece), host_buffer(piece)
    assert read_window(plan, window, buf, (bounce, bounce2), POOL)
    data = path.read_bytes()
    view = bytes(buf.numpy())
    for c in chunks:
        want = data[c.file_offset : c.file_offset + c.nbytes]
        assert view[c.buf_offset : c.buf_offset + c.nbytes] == want
    plan.close()


def test_whole_page_groups_and_scattered_groups_keep_the_per_tensor_reads(tmp_path):
    path = tmp_path / "ckpt.bin"
    path.write_bytes(os.urandom(64 * PAGE))
    aligned = open_plan(
        path, [Chunk(PAGE, 0, 8 * PAGE, 0), Chunk(9 * PAGE, 8 * PAGE, PAGE, 0)], False
    )
    assert window_for(aligned) is None  # whole pages: read as they are
    # 40 KB of other groups' tensors between two of this group's 2000 bytes: reading them
    # would cost more than the per-tensor reads save.
    scattered = open_plan(path, [Chunk(100, 0, 1000, 0), Chunk(40100, 1024, 1000, 0)], False)
    assert window_for(scattered) is None
    near = open_plan(path, [Chunk(100, 0, 1000, 0), Chunk(1500, 1024, 1000, 0)], False)
    assert window_for(near) is not None  # 400 bytes between: one page read covers both
    for p in (aligned, scattered, near):
        p.close()


def test_a_truncated_file_is_refused_not_used(tmp_path):
    path = tmp_path / "ckpt.bin"
    spans = packed_file(path, [50_000, 70_000, 9_000], lead=300, seed=1)
    chunks, span = slab_chunks(path, spans)
    plan = open_plan(path, chunks, owned=False, direct=True)
    window = window_for(plan)
    assert window is not None
    os.truncate(path, spans[-1][0] + 10)  # the last tensor cut short
    with pytest.raises(CorruptGroupFileError, match="truncated"):
        read_window(plan, window, host_buffer(span), bounces(64 * KiB), POOL)
    plan.close()


def test_a_file_that_ends_inside_the_windows_last_page_is_read_whole(tmp_path):
    path = tmp_path / "ckpt.bin"
    spans = packed_file(path, [50_000, 7_000], lead=300, seed=3)
    os.truncate(path, spans[-1][0] + spans[-1][1])  # the file ends with the last tensor
    chunks, span = slab_chunks(path, spans)
    plan = open_plan(path, chunks, owned=False, direct=True)
    window = window_for(plan)
    assert window is not None and window.end > path.stat().st_size
    buf = host_buffer(span)
    assert read_window(plan, window, buf, bounces(16 * KiB), POOL)
    data, view = path.read_bytes(), bytes(buf.numpy())
    assert all(
        view[c.buf_offset : c.buf_offset + c.nbytes]
        == data[c.file_offset : c.file_offset + c.nbytes]
        for c in chunks
    )
    plan.close()


def _count_window_reads(monkeypatch) -> list[int]:  # type: ignore[no-untyped-def]
    calls: list[int] = []
    real = window_read.read_window

    def counted(plan, window, buf, bounces, copier):  # type: ignore[no-untyped-def]
        calls.append(window.end - window.start)
        return real(plan, window, buf, bounces, copier)

    monkeypatch.setattr("offload_core.disk.reader.read_window", counted)
    return calls


@pytest.mark.parametrize("level", ["block", "leaf"])
def test_an_offload_from_its_checkpoint_reads_windows_and_equals_resident(
    tmp_path, monkeypatch, level
):
    from offload_core import BlockLevel, LeafLevel

    calls = _count_window_reads(monkeypatch)
    x, ref = reference("bf16")
    model = make_model("bf16")
    ckpt = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(ckpt))
    tier = DiskTier(str(tmp_path / "ferry"), source_checkpoint=str(ckpt), cpu_read="copy")
    lvl = BlockLevel(1) if level == "block" else LeafLevel()
    handle = apply_offload(model, OffloadPolicy(level=lvl, tier=tier), onload_device="cpu")
    with torch.no_grad():
        outs = [model(**x) for _ in range(3)]
    handle.remove()
    assert all(torch.equal(o, ref) for o in outs)
    # The first forward checks each group's CRC32s chunk by chunk; the later ones read
    # windows (one per group whose tensors do not lie on whole pages).
    assert len(calls) >= 2, calls


def _like(model: DemoDiT):  # type: ignore[no-untyped-def]
    """Builds ``model``'s architecture (on the meta device load_offloaded gives it)."""
    dim, nd, ns = model.dim, len(model.double_blocks), len(model.single_blocks)
    return lambda dev: DemoDiT(dim, max(dim // 64, 1), nd, ns).to(torch.bfloat16).eval()


def test_load_offloaded_reads_windows_from_the_checkpoint(tmp_path, monkeypatch):
    calls = _count_window_reads(monkeypatch)
    x, ref = reference("bf16")
    model = make_model("bf16")
    ckpt = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(ckpt))
    tier = DiskTier(str(tmp_path / "ferry"), cpu_read="copy")
    handle = load_offloaded(str(ckpt), _like(model), OffloadPolicy(tier=tier))
    with torch.no_grad():
        outs = [handle.model(**x) for _ in range(2)]
    handle.remove()
    assert all(torch.equal(o, ref) for o in outs)
    assert calls, "the verbatim groups read their windows from the checkpoint"
