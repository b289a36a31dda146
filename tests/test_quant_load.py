"""load_quantized: streaming quantize-on-load from a real safetensors file, and the cache."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from offload_core.errors import ConfigError
from offload_core.model.demo import DemoDiT, demo_inputs
from offload_core.quant import cache as cache_mod
from offload_core.quant import load_quantized, quantize_model
from tests.helpers import same_weights, tmpfs, torchao_quantize

CPU_QUANT = ["int8-weight", "int8-dynamic", "float8-weight"]
SHAPE = (128, 2, 2, 4)  # dim, heads, double blocks, single blocks: ~9 MB in fp32


def _build(dtype: torch.dtype = torch.float32) -> Callable[[torch.device], nn.Module]:
    def build(device: torch.device) -> nn.Module:
        with torch.device(device):
            return DemoDiT(*SHAPE).to(dtype).eval().requires_grad_(False)

    return build


def _full_model(seed: int = 0) -> DemoDiT:
    torch.manual_seed(seed)
    model = DemoDiT(*SHAPE)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    return model.eval().requires_grad_(False)


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    save_file(_full_model().state_dict(), str(path))
    return path


def _resident(path: Path, preset: str, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The reference: the whole full-precision model in RAM, then quantized by torchao."""
    model = DemoDiT(*SHAPE).eval().requires_grad_(False)
    model.load_state_dict(load_file(str(path)))
    model = model.to(dtype)
    torchao_quantize(model, preset)
    return model


def _out(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(**demo_inputs(model, tokens=24))  # type: ignore[arg-type]


@pytest.mark.parametrize("preset", ["none", *CPU_QUANT])
def test_streaming_load_equals_quantizing_the_resident_model(checkpoint: Path, preset: str) -> None:
    model, report = load_quantized(checkpoint, _build(), preset)
    assert report.cache == "off"
    assert not any(t.is_meta for t in (*model.parameters(), *model.buffers()))
    ref = _resident(checkpoint, preset)
    same_weights(model, ref)
    assert torch.equal(_out(model), _out(ref))
    if preset != "none":
        assert len(report.quantized) > 10
        assert report.bytes_after < report.bytes_before * 0.6
        for r in report.quantized:
            assert type(model.get_submodule(r.name).weight).__name__ in (
                "Int8Tensor",
                "Float8Tensor",
            )


def test_none_preset_is_not_cached(checkpoint: Path, tmp_path: Path) -> None:
    model, report = load_quantized(checkpoint, _build(), "none", cache_dir=tmp_path / "c")
    assert report.cache == "off" and report.cache_path is None
    assert os.listdir(tmp_path / "c") == []
    assert torch.equal(_out(model), _out(_resident(checkpoint, "none")))


def test_a_layer_torchao_declines_stays_full_precision_and_intact(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where torchao hands the weight back unquantized (it does for shapes its kernel cannot
    take), the layer must own its weight: a view of the staging buffer would be overwritten by
    the next layer read into it."""
    from offload_core.quant import quantize as quantize_mod
    from offload_core.quant import streaming

    def decline(module: nn.Linear, config: object) -> None:
        return None

    monkeypatch.setattr(streaming, "quantize_linear", decline)
    monkeypatch.setattr(quantize_mod, "quantize_linear", decline)
    model, report = load_quantized(checkpoint, _build(), "int8-weight")
    assert report.quantized == []
    declined = [
        r for r in report.layers if r.reason.startswith("left in full precision by torchao")
    ]
    assert len(declined) > 10
    assert torch.equal(_out(model), _out(_resident(checkpoint, "none")))
    in_memory = quantize_model(_resident(checkpoint, "none"), "int8-weight")
    assert [r.reason for r in in_memory.layers] == [r.reason for r in report.layers]


def test_checkpoint_dtype_is_converted_to_the_models(checkpoint: Path) -> None:
    model, _ = load_quantized(checkpoint, _build(torch.bfloat16), "int8-weight")
    assert model.img_in.weight.dtype == torch.bfloat16
    ref = _resident(checkpoint, "int8-weight", torch.bfloat16)
    same_weights(model, ref)
    assert torch.equal(_out(model), _out(ref))


@pytest.mark.parametrize("preset", CPU_QUANT)
def test_cache_round_trip_is_bit_identical(checkpoint: Path, tmp_path: Path, preset: str) -> None:
    cache = tmp_path / "cache"
    cold, r1 = load_quantized(checkpoint, _build(), preset, cache_dir=cache)
    warm, r2 = load_quantized(checkpoint, _build(), preset, cache_dir=cache)
    assert (r1.cache, r2.cache) == ("miss", "hit")
    assert r1.cache_path == r2.cache_path and Path(r2.cache_path or "").is_file()
    assert r2.layers == r1.layers
    assert torch.equal(_out(warm), _out(cold))
    for (k1, v1), (k2, v2) in zip(cold.state_dict().items(), warm.state_dict().items()):
        assert k1 == k2 and type(v1) is type(v2)
        names = v1.__tensor_flatten__()[0] if hasattr(v1, "__tensor_flatten__") else [None]
        for n in names:
            a, b = (v1, v2) if n is None else (getattr(v1, n), getattr(v2, n))
            assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8)), (
                k1,
                n,
            )
    assert os.listdir(cache) == [Path(r1.cache_path or "").name]  # no temporary files left


def test_cache_file_is_torchao_safetensors_format(checkpoint: Path, tmp_path: Path) -> None:
    from safetensors import safe_open
    from torchao.prototype.safetensors.safetensors_support import unflatten_tensor_state_dict

    model, report = load_quantized(checkpoint, _build(), "int8-weight", cache_dir=tmp_path / "c")
    path = report.cache_path or ""
    with safe_open(path, "pt") as f:
        metadata = f.metadata()
    tensors, leftover = unflatten_tensor_state_dict(load_file(path), metadata)
    assert leftover == {}
    state = model.state_dict()
    assert set(tensors) == set(state)
    q = tensors["double_blocks.0.img_mlp.0.weight"]
    assert type(q).__name__ == "Int8Tensor"
    assert torch.equal(q.qdata, state["double_blocks.0.img_mlp.0.weight"].qdata)
    assert torch.equal(tensors["img_in.weight"], state["img_in.weight"])


def _flip_data_byte(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(-1000, os.SEEK_END)
        b = f.read(1)
        f.seek(-1000, os.SEEK_END)
        f.write(bytes([b[0] ^ 0x10]))


def _edit_header(path: Path) -> None:
    raw = path.read_bytes()
    i = raw.index(b"quantized")  # inside the stored report: the JSON stays valid
    path.write_bytes(raw[:i] + b"Quantized" + raw[i + 9 :])


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size - 100)


def _garbage(path: Path) -> None:
    path.write_bytes(os.urandom(4096))


@pytest.mark.parametrize("damage", [_flip_data_byte, _edit_header, _truncate, _garbage])
def test_corrupt_cache_entry_is_rebuilt_not_trusted(
    checkpoint: Path, tmp_path: Path, damage: Callable[[Path], None]
) -> None:
    cache = tmp_path / "cache"
    good, r1 = load_quantized(checkpoint, _build(), "int8-weight", cache_dir=cache)
    damage(Path(r1.cache_path or ""))
    rebuilt, r2 = load_quantized(checkpoint, _build(), "int8-weight", cache_dir=cache)
    assert r2.cache == "corrupt (rebuilt)"
    assert torch.equal(_out(rebuilt), _out(good))
    _, r3 = load_quantized(checkpoint, _build(), "int8-weight", cache_dir=cache)
    assert r3.cache == "hit"  # the rebuild replaced the damaged entry
    assert len(os.listdir(cache)) == 1


def test_changed_checkpoint_makes_the_entry_stale(checkpoint: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _, r1 = load_quantized(checkpoint, _build(), "int8-weight", cache_dir=cache)
    # New weights, same names and sizes: the file's size is the same, its mtime is not.
    save_file(_full_model(seed=1).state_dict(), str(checkpoint))
    st = checkpoint.stat()
    os.utime(checkpoint, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    model, r2 = load_quantized(checkpoint, _build(), "int8-weight", cache_dir=cache)
    assert r2.cache == "stale (rebuilt)"
    assert r2.cache_path == r1.cache_path  # the stale entry is replaced, not left behind
    assert torch.equal(_out(model), _out(_resident(checkpoint, "int8-weight")))
    assert len(os.listdir(cache)) == 1


def test_preset_and_skip_list_are_part_of_the_key(checkpoint: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _, a = load_quantized(checkpoint, _build(), "int8-weight", cache_dir=cache)
    _, b = load_quantized(checkpoint, _build(), "float8-weight", cache_dir=cache)
    model, c = load_quantized(
        checkpoint, _build(), "int8-weight", cache_dir=cache, skip=["single_blocks.*"]
    )
    assert (a.cache, b.cache, c.cache) == ("miss", "miss", "miss")
    assert len({a.cache_path, b.cache_path, c.cache_path}) == 3
    assert not any(r.quantized for r in c.layers if r.name.startswith("single_blocks."))
    assert type(model.single_blocks[0].linear1.weight) is nn.Parameter
    _, again = load_quantized(
        checkpoint, _build(), "int8-weight", cache_dir=cache, skip=["single_blocks.*"]
    )
    assert again.cache == "hit" and again.layers == c.layers


def test_disk_full_mid_write_leaves_no_file_and_still_loads(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    calls = {"n": 0}
    real = cache_mod._write_chunk

    def fill_up(f, view):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] > 3:  # the header and a few tensors fit, then the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(f, view)

    monkeypatch.setattr(cache_mod, "_write_chunk", fill_up)
    model, report = load_quantized(checkpoint, _build(), "int8-weight", cache_dir=cache)
    assert calls["n"] == 4
    assert report.cache == f"miss; write failed: {os.strerror(errno.ENOSPC)}"
    assert os.listdir(cache) == []
    assert torch.equal(_out(model), _out(_resident(checkpoint, "int8-weight")))
    monkeypatch.setattr(cache_mod, "_write_chunk", real)
    _, again = load_quantized(checkpoint, _build(), "int8-weight", cache_dir=cache)
    assert again.cache == "miss" and len(os.listdir(cache)) == 1


def test_real_full_disk_mid_write(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The free-space check is told there is room; the 1 MiB filesystem then really fills up.
    real = cache_mod.shutil.disk_usage
    monkeypatch.setattr(cache_mod.shutil, "disk_usage", lambda p: real(p)._replace(free=1 << 40))
    with tmpfs(tmp_path / "tiny", "1m") as tiny:
        model, report = load_quantized(checkpoint, _build(), "int8-weight", cache_dir=tiny)
        left = os.listdir(tiny)
    assert report.cache == f"miss; write failed: {os.strerror(errno.ENOSPC)}"
    assert left == []
    assert torch.equal(_out(model), _out(_resident(checkpoint, "int8-weight")))


def test_too_little_space_is_not_even_tried(checkpoint: Path, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "1m") as small:
        model, report = load_quantized(checkpoint, _build(), "int8-weight", cache_dir=small)
        left = os.listdir(small)
    assert report.cache.startswith("miss; write skipped: needs ")
    assert left == []
    assert torch.equal(_out(model), _out(_resident(checkpoint, "int8-weight")))


def test_progress_reports_every_layer(checkpoint: Path, tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []
    for expected_cache in ("miss", "hit"):
        calls.clear()
        _, report = load_quantized(
            checkpoint,
            _build(),
            "int8-weight",
            cache_dir=tmp_path / "c",
            progress=lambda d, t: calls.append((d, t)),
        )
        assert report.cache == expected_cache
        n = len(report.layers)
        assert calls == [(i, n) for i in range(1, n + 1)]


def test_bad_settings_fail_before_any_work(checkpoint: Path, tmp_path: Path) -> None:
    def setting(**kw) -> str:  # type: ignore[no-untyped-def]
        args = {"checkpoint_path": checkpoint, "build": _build(), "preset": "int8-weight", **kw}
        with pytest.raises(ConfigError) as info:
            load_quantized(**args)
        return info.value.setting

    assert setting(checkpoint_path=tmp_path / "nope.safetensors") == "checkpoint"
    (tmp_path / "text.safetensors").write_text("not a checkpoint")
    assert setting(checkpoint_path=tmp_path / "text.safetensors") == "checkpoint"
    (tmp_path / "afile").write_text("x")
    assert setting(cache_dir=tmp_path / "afile") == "cache_dir"
    assert setting(device="gpu0") == "device"
    assert setting(quantize_device="gpu0") == "quantize_device"
    assert setting(preset="int4-weight", quantize_device="cpu") == "quant_preset"
    assert setting(progress=5) == "progress"

    def other_model(device: torch.device) -> nn.Module:
        return DemoDiT(64, 1, 2, 4)

    with pytest.raises(ConfigError) as info:
        load_quantized(checkpoint, other_model, "int8-weight")
    assert info.value.setting == "checkpoint" and "shapes differ" in str(info.value)

    def on_cpu(device: torch.device) -> nn.Module:
        with torch.device("cpu"):  # ignores the meta device: would hold the full model in RAM
            return DemoDiT(*SHAPE)

    assert setting(build=on_cpu) == "build"


def test_cache_entry_records_its_key(checkpoint: Path, tmp_path: Path) -> None:
    from safetensors import safe_open

    _, report = load_quantized(checkpoint, _build(), "float8-weight", cache_dir=tmp_path / "c")
    with safe_open(report.cache_path or "", "pt") as f:
        key = json.loads(f.metadata()["ferry.key"])
    assert key["preset"] == "float8-weight" and key["device"] == "cpu"
    assert key["checkpoint"]["size"] == checkpoint.stat().st_size
    assert key["checkpoint"]["mtime_ns"] == checkpoint.stat().st_mtime_ns
    assert len(key["checkpoint"]["header_sha256"]) == 64


class _Tied(nn.Module):
    """An output head sharing the embedding's weight (stored once in the checkpoint)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 256)
        self.blocks = nn.ModuleList(nn.Linear(256, 256) for _ in range(2))
        self.head = nn.Linear(256, 32, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


def test_tied_weights_stay_tied_through_load_and_cache(tmp_path: Path) -> None:
    from safetensors.torch import save_model

    torch.manual_seed(0)
    full = _Tied().eval().requires_grad_(False)
    path = tmp_path / "tied.safetensors"
    save_model(full, str(path))  # writes the shared weight under one of its two names
    ids = torch.arange(32).view(2, 16)
    torchao_quantize(full, "int8-weight")  # the blocks; the tied head is outside them
    with torch.no_grad():
        want = full(ids)
    for expected in ("miss", "hit"):
        model, report = load_quantized(
            path, lambda d: _Tied().eval(), "int8-weight", cache_dir=tmp_path / "c"
        )
        assert report.cache == expected
        assert model.head.weight is model.embed.weight
        assert {r.name: r.reason for r in report.layers}[
            "head"
        ] == "weight shared with another layer"
        with torch.no_grad():
            assert torch.equal(model(ids), want)
