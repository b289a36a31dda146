"""The disk tier reads a GGUF model's groups straight from its .gguf (formats/gguf.py): the
index agrees with the ``gguf`` package's reader tensor by tensor, unchanged groups are read
from the file with nothing written, and a changed group is written, as for safetensors."""

from __future__ import annotations

import importlib
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from offload_core import BlockLevel, ConfigError, DiskTier, LeafLevel, OffloadPolicy, apply_offload
from offload_core.formats.gguf import BLOCKS, read_gguf_header
from offload_core.formats.safetensors import read_checkpoint_header
from tests.gguf_standin import WIDTH, gguf_model, raw_bytes, write_gguf

X = torch.randn(3, WIDTH, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module", params=["q8_0", "k"])
def gguf_file(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(tmp_path_factory.mktemp("gguf") / f"net-{request.param}.gguf", request.param)


def test_block_sizes_are_the_gguf_packages() -> None:
    for qtype, (block, size) in gguf.GGML_QUANT_SIZES.items():
        assert BLOCKS[int(qtype)] == (block, size), qtype.name


def test_index_agrees_with_the_gguf_reader(gguf_file: Path) -> None:
    header = read_checkpoint_header(gguf_file, "source_checkpoint")
    reader = gguf.GGUFReader(str(gguf_file))
    assert len(header.entries) == len(reader.tensors) > 0
    with open(gguf_file, "rb") as f:
        for t in reader.tensors:
            st = header.entries[t.name]
            data = np.asarray(t.data)
            assert (st.start, st.nbytes) == (t.data_offset, t.n_bytes), t.name
            assert st.dtype == torch.from_numpy(np.array(data[:0])).dtype and st.shape == data.shape
            f.seek(st.start)
            assert f.read(st.nbytes) == data.tobytes(), t.name
    assert header.metadata["general.architecture"] == "ferry-test"


@pytest.mark.parametrize("cut", [10, 200, -100])
def test_a_damaged_gguf_is_refused_by_the_setting(tmp_path: Path, cut: int) -> None:
    src = write_gguf(tmp_path / "net.gguf", "q8_0").read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(src[:cut])
    with pytest.raises(ConfigError, match=r"source_checkpoint: bad\.gguf cannot be read as GGUF"):
        read_checkpoint_header(bad, "source_checkpoint")


@pytest.mark.parametrize("level", ["block", "leaf"])
def test_disk_tier_reads_unchanged_groups_from_the_gguf(gguf_file: Path, tmp_path: Path, level):
    model = gguf_model(gguf_file)
    with torch.no_grad():
        ref = model(X)
    store = tmp_path / "offload"
    tier = DiskTier(str(store), source_checkpoint=str(gguf_file), cpu_read="copy")
    lvl = BlockLevel(1) if level == "block" else LeafLevel()
    handle = apply_offload(model, OffloadPolicy(level=lvl, tier=tier), onload_device="cpu")
    written = list(store.rglob("*.safetensors"))
    with torch.no_grad():
        outs = [model(X) for _ in range(2)]
    st = handle.stats()
    handle.remove()
    assert written == [], "unchanged GGUF weights are read from the .gguf, nothing written"
    assert st.bytes_disk > 0
    assert all(torch.equal(o, ref) for o in outs)
    assert gguf_file.exists()


def test_a_changed_gguf_weight_is_written(gguf_file: Path, tmp_path: Path) -> None:
    model = gguf_model(gguf_file)
    w = model.blocks[1].a.weight
    changed = raw_bytes(w).clone()
    changed[0, :8] ^= 1  # a weight no longer the file's (the map is read-only: replace it)
    w.data = changed
    with torch.no_grad():
        ref = model(X)
    store = tmp_path / "offload"
    tier = DiskTier(str(store), source_checkpoint=str(gguf_file), cpu_read="copy")
    handle = apply_offload(
        model, OffloadPolicy(level=BlockLevel(1), tier=tier), onload_device="cpu"
    )
    written = sorted(p.name for p in store.rglob("group-*.safetensors"))
    with torch.no_grad():
        out = model(X)
    handle.remove()
    assert written == ["group-00001.safetensors"], written  # the groups: blocks.0, blocks.1, ...
    assert torch.equal(out, ref)


def test_header_metadata_and_alignment(tmp_path: Path) -> None:
    path = tmp_path / "aligned.gguf"
    w = gguf.GGUFWriter(str(path), arch="ferry-test")
    w.add_custom_alignment(64)
    w.add_array("comfy.gguf.orig_shape.conv.weight", [4, 2, 1, 2, 2])
    w.add_tensor("conv.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    st = read_gguf_header(path).entries["conv.weight"]
    assert st.start % 64 == 0 and st.shape == (4, 2, 1, 2, 2) and st.dtype == torch.float32
    with open(path, "rb") as f:
        f.seek(st.start)
        got = torch.frombuffer(bytearray(f.read(st.nbytes)), dtype=torch.float32)
    assert torch.equal(got, torch.arange(32, dtype=torch.float32))


def test_the_gguf_file_is_found_from_the_weights(gguf_file: Path) -> None:
    """ComfyUI-GGUF keeps no path on the model: the node finds the file its weights map."""
    from tests.conftest import PACK_NAME, load_pack

    load_pack()
    model_files = importlib.import_module(f"{PACK_NAME}.seam.model_files")
    model = gguf_model(gguf_file)
    assert model_files.gguf_file_of(model) == str(gguf_file)
    for p in model.parameters():
        p.data = raw_bytes(p).clone()  # copied into RAM: no file to read from
    assert model_files.gguf_file_of(model) is None
    assert model_files.gguf_file_of(torch.nn.Linear(2, 2)) is None
