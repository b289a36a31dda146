"""How an offload ends (offload_core/ending.py, [Note: release by kind of ending]): a restore
gives the weights back group by group (never the network twice in memory), a re-layout peaks at
the network's plain size, and a discard reads nothing back."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from offload_core import (
    BlockLevel,
    ConfigError,
    DiskTier,
    Ending,
    OffloadPolicy,
    RamTier,
    apply_offload,
    find_offload,
    live_offloads,
    load_offloaded,
)
from offload_core.disk.file_source import FileSource
from offload_core.disk.mapped import MappedSource
from offload_core.runtime.memory import process_memory
from offload_core.sources import give_back
from offload_core.sources.host_slab import HostSlabSource
from offload_core.sources.lay_out import LayOut

DIM = 1024
BLOCKS = 16
#: One block: two 1024x1024 float32 Linears, 8 MiB; the network 128 MiB.
BLOCK_BYTES = 2 * (DIM * DIM + DIM) * 4
NET_BYTES = BLOCKS * BLOCK_BYTES


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)) for _ in range(BLOCKS)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


X = torch.randn(2, DIM, generator=torch.Generator().manual_seed(1))


def policy(tier: Any) -> OffloadPolicy:
    return OffloadPolicy(level=BlockLevel(1), tier=tier)


def anon() -> int:
    return process_memory().rss_anon


@contextmanager
def anon_after_each_group(
    peaks: list[int], owner: Any = give_back, verb: str = "restore_group"
) -> Iterator[None]:
    """Records RssAnon right after each group is restored (or placed: ``LayOut, "_place"``):
    the moments a restore that keeps every copy until the end, or a layout whose freed
    originals stay in the heap, would peak."""
    original = getattr(owner, verb)

    def recorded(*args: Any) -> Any:
        out = original(*args)
        peaks.append(anon())
        return out

    setattr(owner, verb, recorded)
    try:
        yield
    finally:
        setattr(owner, verb, original)


@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_a_restore_frees_each_group_as_it_lands(tier: str, tmp_path: Path) -> None:
    net = Net().requires_grad_(False)
    ref = net(X)
    t = RamTier() if tier == "ram" else DiskTier(str(tmp_path), cpu_read="copy")
    handle = apply_offload(net, policy(t), onload_device="cpu")
    assert torch.equal(net(X), ref)
    gc.collect()
    before = anon()
    peaks: list[int] = []
    with anon_after_each_group(peaks):
        handle.remove()
    assert len(peaks) == BLOCKS
    growth = max(peaks) - before
    # The RAM tier's slabs already hold the network: giving it back group by group costs at
    # most a group or two more. The disk tier holds nothing: the network comes back whole,
    # and only that (a restore that kept every slab until the end grew by the network again).
    allowed = 3 * BLOCK_BYTES if tier == "ram" else NET_BYTES + 3 * BLOCK_BYTES
    assert growth <= allowed, (
        f"restore grew RssAnon by {growth >> 20} MiB (allowed {allowed >> 20})"
    )
    assert torch.equal(net(X), ref)


@pytest.mark.parametrize(("first", "second"), [("ram", "disk"), ("disk", "ram")])
def test_a_relayout_peaks_at_the_networks_plain_size(
    first: str, second: str, tmp_path: Path
) -> None:
    """A new tier for a laid-out network: the old layout gives the weights back group by
    group, the new one takes them group by group; never both layouts at once."""

    def tier(name: str) -> Any:
        return RamTier() if name == "ram" else DiskTier(str(tmp_path / name), cpu_read="copy")

    net = Net().requires_grad_(False)
    ref = net(X)
    for warm in (first, second):  # what a first layout of each tier allocates once for good
        apply_offload(net, policy(tier(warm)), onload_device="cpu").remove()
    gc.collect()
    plain = anon()  # the network in RAM, as the host had it
    handle = apply_offload(net, policy(tier(first)), onload_device="cpu")
    peaks: list[int] = []
    with anon_after_each_group(peaks):
        handle.remove()
    # The new layout frees each restored tensor as its group lands: into the C heap, which
    # the next groups' slabs (mapped anew) do not reuse unless it is trimmed.
    with anon_after_each_group(peaks, LayOut, "_place"):
        handle = apply_offload(net, policy(tier(second)), onload_device="cpu")
    assert torch.equal(net(X), ref)
    handle.remove()
    worst = max(peaks) - plain
    steps = [(p - plain) >> 20 for p in peaks]
    # A group or two in flight, and the heap's fragments of the read buffers (a quarter of
    # the network at most): holding the network twice is 16 groups.
    assert worst <= 4 * BLOCK_BYTES, f"re-layout held {worst >> 20} MiB above plain: {steps}"


def _reads_forbidden(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every way a layout's bytes come back to the host fails the test if used."""
    calls: list[str] = []

    def forbid(name: str) -> Callable[..., Any]:
        def read(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            raise AssertionError(f"{name} read a discarded layout back")

        return read

    for cls in (FileSource, MappedSource, HostSlabSource):
        monkeypatch.setattr(cls, "host_bytes", forbid(f"{cls.__name__}.host_bytes"))
        monkeypatch.setattr(cls, "load", forbid(f"{cls.__name__}.load"))  # no new load either
    monkeypatch.setattr(give_back, "restore_group", forbid("give_back.restore_group"))
    return calls


def _rchar() -> int:
    """Bytes this process read through read syscalls so far (Linux)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.mark.parametrize(
    "tier", ["ram", "disk-copy", "disk-mapped", "disk-checkpoint", "loaded-from-file"]
)
def test_a_discard_reads_nothing_back(
    tier: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = tmp_path / "net.safetensors"
    net = Net().requires_grad_(False)
    ref = net(X)
    disk = tmp_path / "ferry"
    if tier == "ram":
        handle = apply_offload(net, policy(RamTier()), onload_device="cpu")
    elif tier in ("disk-copy", "disk-mapped"):
        read = "copy" if tier == "disk-copy" else "mapped"
        handle = apply_offload(net, policy(DiskTier(str(disk), cpu_read=read)), onload_device="cpu")
    elif tier == "disk-checkpoint":
        save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(ckpt))
        t = DiskTier(str(disk), source_checkpoint=str(ckpt), cpu_read="copy")
        handle = apply_offload(net, policy(t), onload_device="cpu")
    else:
        save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(ckpt))
        handle = load_offloaded(
            str(ckpt), lambda _: Net().requires_grad_(False), policy(DiskTier(str(disk))),
            onload_device="cpu",
        )  # fmt: skip
        net = handle.model
    assert torch.equal(net(X), ref)
    folder = handle.stats().disk_folder
    del net  # the host dropped it: only Ferry's handle is left
    gc.collect()
    calls = _reads_forbidden(monkeypatch)
    before_read, before_anon = _rchar(), anon()
    handle.remove(Ending.DISCARD)
    read = _rchar() - before_read
    assert calls == []
    # The last forward left the next forward's first group in flight (prefetch depth 1): a
    # discard waits for that read to land before it frees its slot, so one group's bytes may
    # be counted here; a read-back would be all sixteen.
    assert read < BLOCK_BYTES + (1 << 20), f"a discard read {read} bytes"
    assert handle.removed and handle not in live_offloads()
    if folder is not None:
        assert not Path(folder).exists(), "a discarded layout's files stay behind"
    if tier == "ram":  # the slabs went back to the system, and nothing was copied first
        assert anon() <= before_anon - NET_BYTES // 2
    model = handle.model
    assert find_offload(model) is None
    assert all(p.device.type == "meta" for p in model.blocks.parameters())


def test_a_discarded_network_fails_loudly_if_someone_kept_it() -> None:
    net = Net().requires_grad_(False)
    handle = apply_offload(net, policy(RamTier()), onload_device="cpu")
    handle.remove("discard")
    with pytest.raises((NotImplementedError, RuntimeError)):
        net(X)


def test_a_discard_of_a_damaged_layout_raises_nothing(tmp_path: Path) -> None:
    net = Net().requires_grad_(False)
    handle = apply_offload(
        net, policy(DiskTier(str(tmp_path), cpu_read="copy")), onload_device="cpu"
    )
    folder = Path(handle.stats().disk_folder or "")
    for f in folder.iterdir():  # every group file truncated: a restore would lose them all
        if f.is_file():
            f.write_bytes(f.read_bytes()[:100])
    handle.remove(Ending.DISCARD)
    assert handle.removed and not folder.exists()


def test_an_unknown_ending_is_refused_before_anything_is_released() -> None:
    net = Net().requires_grad_(False)
    handle = apply_offload(net, policy(RamTier()), onload_device="cpu")
    with pytest.raises(ConfigError, match="ending: must be one of 'restore', 'discard'"):
        handle.remove("forget")
    assert not handle.removed
    handle.remove()
    assert net(X).shape == (2, DIM)
