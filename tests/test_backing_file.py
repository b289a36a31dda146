"""The disk tier reads a host loader's weights in place from the file whose mapping they still
are (offload_core/sources/backing_file.py), and never from a wrong file: the tensor must sit at
a key's offset with its dtype and shape, the file must be the mapped one (device, inode), read
as a checkpoint (header) and not be shorter than its mapping (size)."""

from __future__ import annotations

import mmap
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from offload_core import DiskTier, OffloadPolicy, apply_offload
from offload_core.disk.maps import file_mappings
from offload_core.formats.safetensors import read_header
from offload_core.sources.backing_file import backing_files
from tests.helpers import make_model, reference

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/self/maps"
)


@contextmanager
def mapped(path: Path) -> Iterator[dict[str, torch.Tensor]]:
    """Every tensor of the file as a view of one private mapping of it, as a host loader
    leaves them (ComfyUI v0.33's load_safetensors)."""
    header = read_header(path)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as m:
        whole = torch.frombuffer(m, dtype=torch.uint8)
        views = {
            k: whole[st.start : st.end].view(st.dtype).view(st.shape)
            for k, st in header.entries.items()
        }
        yield views
        del views, whole


def write(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return path


def small(tmp_path: Path) -> Path:
    return write(
        tmp_path / "w.safetensors",
        {"a": torch.arange(64, dtype=torch.float32), "b": torch.ones(8, 4, dtype=torch.float16)},
    )


def test_finds_each_tensors_key_by_its_offset(tmp_path: Path) -> None:
    path = small(tmp_path)
    with mapped(path) as t:
        found = backing_files([("x", t["a"]), ("y", t["b"])])
        assert {n: k for n, (_, k) in found.keys.items()} == {"x": "a", "y": "b"}
        assert found.files() == [path]


def test_a_tensor_off_its_keys_offset_or_shape_is_not_the_files(tmp_path: Path) -> None:
    path = small(tmp_path)
    with mapped(path) as t:
        a = t["a"]
        found = backing_files(
            [
                ("slice", a[1:]),  # inside a's bytes, not at a key's start
                ("dtype", a.view(torch.int32)),  # at a's start, another dtype
                ("shape", a.view(8, 8)),  # at a's start, another shape
                ("strided", t["b"].t()),  # at b's start, not as stored
                ("copy", a.clone()),  # not the file's pages at all
            ]
        )
        assert found.keys == {}


def test_a_file_that_is_not_a_checkpoint_is_refused_by_its_header(tmp_path: Path) -> None:
    path = tmp_path / "junk.safetensors"
    path.write_bytes(b"\xff" * 8 + b"not a header" * 500)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as m:
        t = torch.frombuffer(m, dtype=torch.uint8)[16:32]
        found = backing_files([("t", t)])
        del t
    assert found.keys == {}
    assert "junk.safetensors does not read as a checkpoint" in found.notes[0]


def test_a_file_cut_short_since_it_was_mapped_is_refused_by_its_size(tmp_path: Path) -> None:
    path = write(tmp_path / "big.safetensors", {"a": torch.ones(4096, 4), "b": torch.ones(4096)})
    with mapped(path) as t:
        # Rewritten in place, shorter (the same inode): a header that still parses, whose
        # first tensor starts where the mapped one did.
        with open(path, "r+b") as f:
            f.write(_header_of(tmp_path, {"a": torch.ones(4096, 4)}))
            f.truncate(os.path.getsize(tmp_path / "short.safetensors"))
        found = backing_files([("a", t["a"])])
    assert found.keys == {}
    assert "big.safetensors is shorter than its mapping" in found.notes[0]


def _header_of(tmp_path: Path, tensors: dict[str, torch.Tensor]) -> bytes:
    short = write(tmp_path / "short.safetensors", tensors)
    return short.read_bytes()


def test_a_file_replaced_since_it_was_mapped_is_refused(tmp_path: Path) -> None:
    path = small(tmp_path)
    with mapped(path) as t:
        write(tmp_path / "new.safetensors", {"a": torch.zeros(64), "b": torch.zeros(8, 4)})
        os.replace(tmp_path / "new.safetensors", path)  # the old file is unlinked, still mapped
        assert backing_files([("a", t["a"])]).keys == {}


def test_the_mapping_must_be_the_paths_file_now(tmp_path: Path) -> None:
    """The kernel's device and inode of the mapping against the path's now (a maps file
    written with the real line's fields, once with another inode)."""
    path = small(tmp_path)
    with mapped(path) as t:
        (line,) = [m for m in file_mappings() if m.path == str(path)]
        maps = tmp_path / "maps"
        for inode, expect in ((line.inode, {"x": "a"}), (line.inode + 1, {})):
            dev = f"{line.dev[0]:02x}:{line.dev[1]:02x}"
            maps.write_text(
                f"{line.lo:x}-{line.hi:x} r--p {line.offset:08x} {dev} {inode} {path}\n"
            )
            found = backing_files([("x", t["a"])], maps)
            assert {n: k for n, (_, k) in found.keys.items()} == expect
        assert "was replaced after it was loaded" in found.notes[0]


# -- the disk tier ------------------------------------------------------------------------------


def mapped_model(ckpt: Path, views: dict[str, torch.Tensor]) -> nn.Module:
    """The test model whose every tensor is the file's mapped view (no copy), as a host
    loader that assigns the state dict leaves it."""
    model = make_model("bf16")
    model.load_state_dict(views, assign=True)
    for name, t in model.state_dict().items():
        assert t.data_ptr() == views[name].data_ptr(), name
    return model


def test_disk_tier_reads_a_mapped_models_groups_in_place(tmp_path: Path) -> None:
    x, ref = reference("bf16")
    ckpt = write(tmp_path / "model.safetensors", make_model("bf16").state_dict())
    store = tmp_path / "offload"
    with mapped(ckpt) as views:
        model = mapped_model(ckpt, views)
        handle = apply_offload(model, OffloadPolicy(tier=DiskTier(str(store))), onload_device="cpu")
        written = list(store.rglob("*.safetensors"))
        with torch.no_grad():
            out = model(**x)
        st = handle.stats()
        handle.remove()
        del model
    assert written == [], "the file's own pages: nothing written"
    assert any(n.startswith("read in place from " + str(ckpt)) for n in st.notes), st.notes
    assert st.bytes_disk > 0
    assert torch.equal(out, ref)


def test_only_the_groups_a_change_touched_are_written(tmp_path: Path) -> None:
    ckpt = write(tmp_path / "model.safetensors", make_model("bf16").state_dict())
    x = reference("bf16")[0]
    store = tmp_path / "offload"
    with mapped(ckpt) as views:
        model = mapped_model(ckpt, views)
        block = model.double_blocks[0].img_attn.qkv  # a LoRA baked in: a new tensor
        block.weight = nn.Parameter(block.weight * 2, requires_grad=False)
        # A private page written in place: still in the mapping, no longer the file's bytes.
        with torch.no_grad():
            model.double_blocks[1].img_attn.qkv.weight.mul_(2)
            ref = model(**x)
        handle = apply_offload(model, OffloadPolicy(tier=DiskTier(str(store))), onload_device="cpu")
        written = sorted(p.name for p in store.rglob("group-*.safetensors"))
        with torch.no_grad():
            out = model(**x)
        handle.remove()
        del model, block
    assert written == ["group-00000.safetensors", "group-00001.safetensors"]
    assert torch.equal(out, ref)


# -- the file a host names (source_checkpoint), by the tensors' names ---------------------------


class Holder(nn.Module):
    """A host's wrapper whose names carry a prefix the file's keys do not (a CLIP's
    ``t5xxl.transformer.`` before the T5 file's ``encoder.``)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.transformer = inner

    def forward(self, **x: torch.Tensor) -> torch.Tensor:
        return self.transformer(**x)


@pytest.mark.parametrize("same_file", [True, False])
def test_a_named_file_is_read_where_its_bytes_are_the_groups(
    tmp_path: Path, same_file: bool
) -> None:
    x, ref = reference("bf16")
    saved = make_model("bf16").state_dict()
    if not same_file:  # the right names, shapes and dtypes; other values
        saved = {k: v + 1 if v.is_floating_point() else v for k, v in saved.items()}
    ckpt = write(tmp_path / "model.safetensors", saved)
    model = Holder(make_model("bf16"))  # copies in RAM: found by name, compared by bytes
    store = tmp_path / "offload"
    tier = DiskTier(str(store), source_checkpoint=str(ckpt))
    handle = apply_offload(model, OffloadPolicy(tier=tier), onload_device="cpu")
    written = list(store.rglob("group-*.safetensors"))
    with torch.no_grad():
        out = model(**x)
    st = handle.stats()
    handle.remove()
    assert torch.equal(out, ref)
    if same_file:
        assert written == []
        assert any(n.startswith(f"read in place from {ckpt}") for n in st.notes), st.notes
    else:
        assert len(written) == st.groups - st.resident_groups
