"""No fault strands a model (issue 12), through offload_core on real files and filesystems.

A group file damaged between two forwards is rewritten from the checkpoint the model was laid
out from, and the forward that met the damage returns the resident output; a model whose only
copy was the damaged file fails saying so, and remove() always lets go of it completely.
"""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from offload_core import (
    CorruptGroupFileError,
    DiskPathError,
    DiskTier,
    OffloadPolicy,
    apply_offload,
    find_offload,
    registry,
)
from offload_core.disk import folder as disk_folder
from offload_core.disk.files import files
from offload_core.errors import WeightsLostError
from offload_core.loader import load_offloaded
from offload_core.model.demo import DemoDiT, build_demo_model, demo_inputs
from tests.helpers import fail_first_read_with_eio, flip_byte, make_model, reference, tmpfs

PREFIX = "model.diffusion_model."


@pytest.fixture(scope="module")
def stored() -> DemoDiT:
    return build_demo_model(0.01, dtype=torch.bfloat16)


def _run(model: nn.Module, ref: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(**demo_inputs(ref, tokens=16))  # type: ignore[arg-type]


def _streamed(stored: DemoDiT, tmp_path: Path, cpu_read: str, folder: Path | None = None):  # type: ignore[no-untyped-def]
    """A bf16 checkpoint laid out as float32 (as ComfyUI does on a CPU): every group is cast,
    so every group is a Ferry file whose source of truth is the checkpoint."""
    path = tmp_path / "m.safetensors"
    if not path.exists():
        save_file({PREFIX + k: v.contiguous() for k, v in stored.state_dict().items()}, str(path))
    ref = copy.deepcopy(stored).float()
    dim, nd, ns = stored.dim, len(stored.double_blocks), len(stored.single_blocks)
    handle = load_offloaded(
        path,
        lambda dev: DemoDiT(dim, max(dim // 64, 1), nd, ns).float().eval().requires_grad_(False),
        OffloadPolicy(tier=DiskTier(str(folder or tmp_path / "ferry"), cpu_read=cpu_read)),
        onload_device="cpu",
        prefix=PREFIX,
    )
    expected = _run(ref, ref)
    assert torch.equal(_run(handle.model, ref), expected)
    files = sorted((folder or tmp_path / "ferry").rglob("group-*.safetensors"))
    assert files, "every group is a written file"
    return handle, ref, expected, files


FAULTS = {
    "truncated": lambda files: os.truncate(files[2], files[2].stat().st_size - 100),
    "flipped": lambda files: flip_byte(files[2], keep_mtime=True),
    "deleted": lambda files: files[2].unlink(),
    "replaced": lambda files: shutil.copyfile(files[1], files[2]),  # same inode, new bytes
    "folder-deleted": lambda files: shutil.rmtree(files[0].parent),
}


@pytest.mark.parametrize("cpu_read", ["mapped", "copy"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_damaged_group_file_is_rewritten_from_checkpoint(stored, tmp_path, fault, cpu_read, caplog):  # type: ignore[no-untyped-def]
    handle, ref, expected, files = _streamed(stored, tmp_path, cpu_read)
    FAULTS[fault](files)
    with caplog.at_level("WARNING", logger="ferry"):
        outs = [_run(handle.model, ref) for _ in range(2)]  # the first one meets the damage
    assert all(torch.equal(o, expected) for o in outs)
    if fault in ("truncated", "flipped", "replaced"):
        # A deleted file's open descriptor still reads its bytes: nothing to repair then.
        assert caplog.text.count("group-00002.safetensors was damaged; rewrote it from") == 1
        assert files[2].stat().st_size == handle._placement.runtimes[2].source.file_plan.size
    handle.remove()
    assert find_offload(handle.model) is None
    assert not (tmp_path / "ferry" / "ferry-DemoDiT").exists()
    # and the same checkpoint lays out again, as a node re-applying would
    again, ref, expected, _ = _streamed(stored, tmp_path, cpu_read)
    again.remove()


def test_damage_during_a_forward_is_repaired_by_the_next(stored, tmp_path):  # type: ignore[no-untyped-def]
    """A file truncated while its group computes from its mapping: that forward fails (a
    release-time check), never returning a wrong output; the next one is repaired."""
    handle, ref, expected, files = _streamed(stored, tmp_path, "mapped")
    blocks = handle.model.single_blocks  # type: ignore[union-attr]
    last = files[handle._placement.runtimes.index(handle._placement.streamed[-1])]

    def damage(*args: object) -> None:  # a forward hook's result would replace the output
        flip_byte(last, keep_mtime=True)

    hook = blocks[0].register_forward_hook(damage)
    try:
        _run(handle.model, ref)
    except CorruptGroupFileError:
        pass  # detected at release: the forward did not return
    hook.remove()
    assert torch.equal(_run(handle.model, ref), expected)
    handle.remove()


def _plain_on_disk(tmp_path: Path, cpu_read: str):  # type: ignore[no-untyped-def]
    x, ref = reference("fp32")
    model = make_model("fp32", cached=False)
    tier = DiskTier(str(tmp_path / "ferry"), cpu_read=cpu_read)
    handle = apply_offload(model, OffloadPolicy(tier=tier), onload_device="cpu")
    with torch.no_grad():
        assert torch.equal(model(**x), ref)
    return model, handle, sorted((tmp_path / "ferry").rglob("group-*.safetensors")), x, ref


@pytest.mark.parametrize("cpu_read", ["mapped", "copy"])
def test_no_source_says_so_and_remove_lets_go_completely(tmp_path, cpu_read):  # type: ignore[no-untyped-def]
    model, handle, files, x, ref = _plain_on_disk(tmp_path, cpu_read)
    os.truncate(files[3], files[3].stat().st_size - 100)
    for _ in range(2):  # never a wrong output
        with torch.no_grad(), pytest.raises(CorruptGroupFileError, match="load the model again"):
            model(**x)
    with pytest.raises(WeightsLostError, match="meta device") as e:
        handle.remove()
    assert "group-00003" in str(e.value)
    assert handle.removed and find_offload(model) is None
    assert handle not in registry.live_offloads()
    assert not (tmp_path / "ferry").exists(), "the damaged layout's files are gone too"
    lost = {n for n, p in model.named_parameters() if p.device.type == "meta"}
    assert lost and len(lost) < len(list(model.parameters())), "only the damaged group"
    handle.remove()  # idempotent
    # Loading the model again (as ComfyUI does once its cache is reset) lays it out again.
    model2 = make_model("fp32", cached=False)
    again = apply_offload(model2, OffloadPolicy(tier=DiskTier(str(tmp_path / "ferry"))))
    with torch.no_grad():
        assert torch.equal(model2(**x), ref)
    again.remove()


def test_eio_on_a_reader_thread_then_the_next_forward_is_equal(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    model, handle, _, x, ref = _plain_on_disk(tmp_path, "copy")
    # The platform's reads (os.preadv here, seek + readinto on Windows).
    failed = fail_first_read_with_eio(files(), monkeypatch)
    with torch.no_grad(), pytest.raises(OSError, match="Input/output"):
        model(**x)
    assert failed
    with torch.no_grad():
        assert torch.equal(model(**x), ref)
    handle.remove()


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_interrupt_inside_a_block_then_the_next_forward_is_equal(stored, tmp_path, exc):  # type: ignore[no-untyped-def]
    handle, ref, expected, _ = _streamed(stored, tmp_path, "copy")
    armed = [True]

    def boom(module, args):  # type: ignore[no-untyped-def]
        if armed[0]:
            armed[0] = False
            raise exc("cancelled mid-sampling")

    hook = handle.model.double_blocks[1].register_forward_pre_hook(boom)  # type: ignore[union-attr]
    with pytest.raises(exc):
        _run(handle.model, ref)
    hook.remove()
    assert torch.equal(_run(handle.model, ref), expected)
    handle.remove()


def test_disk_filling_while_streaming_a_layout(stored, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    real = disk_folder.shutil.disk_usage
    monkeypatch.setattr(disk_folder.shutil, "disk_usage", lambda p: real(p)._replace(free=1 << 40))
    with tmpfs(tmp_path / "tiny", "1m") as tiny:
        with pytest.raises(DiskPathError, match="filled up"):
            _streamed(stored, tmp_path, "mapped", folder=tiny)
        assert list(tiny.rglob("*")) == []
    handle, _, _, _ = _streamed(stored, tmp_path, "mapped")  # the next layout runs, equal
    handle.remove()


@pytest.mark.parametrize("same", [True, False])
def test_source_checkpoint_is_a_source_of_truth_only_when_its_bytes_match(tmp_path, same):  # type: ignore[no-untyped-def]
    """DiskTier(source_checkpoint=...) on a model loaded (and cast) from it: a damaged group
    file is rewritten from it; a checkpoint whose weights differ is never used for that."""
    model = make_model("fp32", cached=False).requires_grad_(False)
    with torch.no_grad():
        for p in model.parameters():  # the weights a bf16 file cast to float32 gives
            p.copy_(p.to(torch.bfloat16).float())
    sd = {k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    if not same:
        sd = {k: (v * 2 if v.is_floating_point() else v) for k, v in sd.items()}
    ckpt = tmp_path / "m.safetensors"
    save_file(sd, str(ckpt))
    x, _ = reference("fp32")
    with torch.no_grad():
        expected = model(**x)
    tier = DiskTier(str(tmp_path / "ferry"), source_checkpoint=str(ckpt))
    handle = apply_offload(model, OffloadPolicy(tier=tier), onload_device="cpu")
    files = sorted((tmp_path / "ferry").rglob("group-*.safetensors"))
    assert files, "cast groups are written"
    os.truncate(files[1], files[1].stat().st_size - 100)
    with torch.no_grad():
        if same:
            assert torch.equal(model(**x), expected)
            assert torch.equal(model(**x), expected)
            handle.remove()
            assert all(p.device.type == "cpu" for p in model.parameters())
            return
        with pytest.raises(CorruptGroupFileError, match="load the model again"):
            model(**x)
    with pytest.raises(WeightsLostError):
        handle.remove()
    assert find_offload(model) is None
