"""load_offloaded (issue 11): a meta-built model filled straight from its checkpoint.

Every tier and level gives the resident output exactly; a group stored as computed keeps the
checkpoint as its disk source (nothing written) and a cast one is written; convert() bakes a
change group by group; a bad file fails naming ``checkpoint`` before any weight moves.
"""

from __future__ import annotations

import copy
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from offload_core import (
    BlockLevel,
    ConfigError,
    DiskTier,
    LeafLevel,
    OffloadPolicy,
    PinnedRamTier,
    RamTier,
)
from offload_core.loader import load_offloaded
from offload_core.model.demo import DemoDiT, build_demo_model, demo_inputs


def _save(model: nn.Module, path: Path, prefix: str = "") -> Path:
    save_file({prefix + k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


@pytest.fixture(scope="module")
def stored() -> DemoDiT:
    return build_demo_model(0.01, dtype=torch.bfloat16)


def _builder(m: DemoDiT):  # type: ignore[no-untyped-def]
    dim, nd, ns = m.dim, len(m.double_blocks), len(m.single_blocks)
    return lambda dev: DemoDiT(dim, max(dim // 64, 1), nd, ns).float().eval().requires_grad_(False)


def _run(model: nn.Module, ref: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(**demo_inputs(ref, tokens=16))  # type: ignore[arg-type]


TIERS = {
    "disk": lambda d: DiskTier(str(d / "ferry")),
    "disk-copy": lambda d: DiskTier(str(d / "ferry"), cpu_read="copy"),
    "ram": lambda d: RamTier(),
    "pinned": lambda d: PinnedRamTier(),
}


CASES = [(t, BlockLevel(2)) for t in TIERS] + [("disk", LeafLevel()), ("ram", LeafLevel())]


@pytest.mark.parametrize("stored_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("tier", "level"), CASES, ids=[f"{t}-{lv.__class__.__name__}" for t, lv in CASES]
)
def test_equal_to_resident_in_every_tier(stored, tier, level, stored_dtype, tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = copy.deepcopy(stored).to(stored_dtype)
    path = _save(src, tmp_path / "m.safetensors", prefix="model.diffusion_model.")
    ref = copy.deepcopy(src).float()
    expected = _run(ref, ref)
    seen: list[tuple[int, int]] = []
    handle = load_offloaded(
        path,
        _builder(stored),
        OffloadPolicy(level=level, tier=TIERS[tier](tmp_path)),
        onload_device="cpu",
        prefix="model.diffusion_model.",
        progress=lambda done, total: seen.append((done, total)),
    )
    model = handle.model
    assert torch.equal(_run(model, ref), expected)
    assert torch.equal(_run(model, ref), expected)  # the second pass reads the sources again
    assert seen[-1][0] == seen[-1][1] == len(handle.plan.groups)
    store = handle._placement.store
    if store is not None:
        verbatim = stored_dtype == torch.float32  # the file holds what the model computes with
        assert (len(store.written) == 0) == verbatim
        assert len(store.written) in (0, len(handle.plan.groups))
    handle.remove()
    assert {t.device.type for t in [*model.parameters(), *model.buffers()]} == {"meta"}
    assert not (tmp_path / "ferry" / "ferry-DemoDiT").exists()


def test_convert_bakes_a_change_group_by_group(stored, tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = copy.deepcopy(stored).float()
    path = _save(src, tmp_path / "m.safetensors")
    changed = {"double_blocks.0.img_mlp.0.weight", "img_in.weight"}
    calls: list[str] = []

    def convert(name: str, t: torch.Tensor) -> torch.Tensor:
        calls.append(name)
        return t * 2

    ref = copy.deepcopy(src)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name in changed:
                p.mul_(2)
    handle = load_offloaded(
        path,
        _builder(stored),
        OffloadPolicy(level=BlockLevel(1), tier=DiskTier(str(tmp_path / "ferry"))),
        onload_device="cpu",
        convert=convert,
        converts=changed.__contains__,
    )
    assert sorted(calls) == sorted(changed)
    assert torch.equal(_run(handle.model, ref), _run(ref, ref))
    # Only the changed block's group is written; the others read the checkpoint.
    store = handle._placement.store
    assert store is not None and len(store.written) == 1
    handle.remove()


def _corrupt(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(bytes(data[: len(data) - 1000]))
    elif how == "header-lies":
        (n,) = struct.unpack("<Q", data[:8])
        path.write_bytes(struct.pack("<Q", n + 10_000_000) + bytes(data[8:]))
    elif how == "not-safetensors":
        path.write_bytes(b"PK\x03\x04 a zip, not a safetensors file" * 100)


@pytest.mark.parametrize("how", ["truncated", "header-lies", "not-safetensors", "missing"])
def test_a_bad_file_fails_naming_checkpoint_before_anything_moves(stored, how, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = _save(copy.deepcopy(stored).float(), tmp_path / "m.safetensors")
    if how == "missing":
        sd = {k: v for k, v in stored.state_dict().items() if k != "proj_out.bias"}
        save_file(sd, str(path))
    else:
        _corrupt(path, how)
    with pytest.raises(ConfigError) as err:
        load_offloaded(
            path,
            _builder(stored),
            OffloadPolicy(tier=DiskTier(str(tmp_path / "ferry"))),
            onload_device="cpu",
        )
    assert err.value.setting == "checkpoint" and "m.safetensors" in str(err.value)
    assert not (tmp_path / "ferry").exists()  # nothing was written or claimed
