"""Bad input gets a clear error before any work; a fault loses nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import torch

from offload_core import (
    BlockLevel,
    ConfigError,
    CorruptGroupFileError,
    DiskPathError,
    DiskTier,
    OffloadPolicy,
    apply_offload,
    plan_offload,
)
from offload_core.disk import folder as disk_folder
from tests.helpers import flip_byte, make_model, reference, snapshot, state_equal, tmpfs

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("n", [0, -1, 1.5, True, 10_000])
def test_bad_block_counts_name_the_setting(n):
    model = make_model("fp32")
    with pytest.raises(ConfigError) as e:
        plan_offload(model, OffloadPolicy(level=BlockLevel(n)), onload_device="cpu")
    assert e.value.setting == "blocks_per_group"
    if n == 10_000:
        assert "between 1 and" in str(e.value)


@pytest.mark.parametrize(
    "field,value",
    [("prefetch_depth", 0), ("prefetch_depth", 99), ("vram_budget", -5), ("headroom_bytes", -1)],
)
def test_bad_policy_values_name_the_setting(field, value):
    kwargs = {field: value}
    with pytest.raises(ConfigError) as e:
        OffloadPolicy(**kwargs).validate()
    assert e.value.setting.startswith(field.split("_bytes")[0])


def test_flat_settings_round_trip_and_rejects():
    p = OffloadPolicy.from_dict(
        {"level": "block", "blocks_per_group": 2, "tier": "disk", "disk_path": "/x"}
    )
    assert OffloadPolicy.from_dict(p.to_dict()) == p
    for bad, setting in [
        ({"tier": "tape"}, "tier"),
        ({"level": "giant"}, "level"),
        ({"tier": "disk"}, "disk_path"),
        ({"vram_budget_gb": "lots"}, "vram_budget_gb"),
        ({"colour": 1}, "colour"),
    ]:
        with pytest.raises(ConfigError) as e:
            OffloadPolicy.from_dict(bad)
        assert e.value.setting == setting


def _disk_error(path: str, model=None) -> DiskPathError:
    model = model or make_model("fp32")
    before, ids, _ = snapshot(model)
    with pytest.raises(DiskPathError) as e:
        apply_offload(model, OffloadPolicy(tier=DiskTier(path)), onload_device="cpu")
    assert e.value.setting == "disk_path"
    after, ids_after, _ = snapshot(model)
    assert state_equal(before, after) and ids == ids_after, "a refused apply moves nothing"
    return e.value


def test_disk_path_that_is_a_file(tmp_path):
    f = tmp_path / "not-a-folder"
    f.write_text("user data")
    assert "is a file" in str(_disk_error(str(f)))
    assert f.read_text() == "user data"


def test_disk_path_that_cannot_be_created(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    assert "cannot create" in str(_disk_error(str(f / "sub" / "dir")))


def test_disk_path_read_only(tmp_path):
    with tmpfs(tmp_path / "ro", "1m", readonly=True) as ro:
        msg = str(_disk_error(str(ro)))
    assert "read-only" in msg or "cannot write" in msg


def test_disk_path_too_small_is_refused_before_writing(tmp_path):
    with tmpfs(tmp_path / "small", "2m") as small:
        msg = str(_disk_error(str(small)))
        assert list(small.iterdir()) == [], "nothing written"
    assert "2.00 MiB free" in msg and "need" in msg


def test_disk_filling_up_mid_write_loses_nothing(tmp_path, monkeypatch):
    x, ref = reference("fp32")
    model = make_model("fp32")
    before, ids, _ = snapshot(model)
    # The free-space check is told there is room; the real filesystem then runs out.
    real = disk_folder.shutil.disk_usage
    monkeypatch.setattr(disk_folder.shutil, "disk_usage", lambda p: real(p)._replace(free=1 << 40))
    with tmpfs(tmp_path / "tiny", "5m") as tiny:
        with pytest.raises(DiskPathError, match="filled up") as e:
            apply_offload(model, OffloadPolicy(tier=DiskTier(str(tiny))), onload_device="cpu")
        left = list(tiny.rglob("*"))
    assert e.value.setting == "disk_path"
    assert left == [], f"partial files left: {left}"
    after, ids_after, _ = snapshot(model)
    assert ids_after == ids and state_equal(before, after)
    with torch.no_grad():
        assert torch.equal(model(**x), ref), "the model is resident and usable"


@pytest.mark.parametrize("field", ["verify", "cpu_read"])
def test_bad_disk_tier_options_name_the_setting(tmp_path, field):
    with pytest.raises(ConfigError) as e:
        OffloadPolicy(tier=DiskTier(str(tmp_path), **{field: "sometimes"})).validate()
    assert e.value.setting == field


def _applied_on_disk(tmp_path, cpu_read="mapped"):
    x, ref = reference("fp32")
    model = make_model("fp32")
    tier = DiskTier(str(tmp_path), cpu_read=cpu_read)
    handle = apply_offload(model, OffloadPolicy(tier=tier), onload_device="cpu")
    with torch.no_grad():
        assert torch.equal(model(**x), ref)
    files = sorted(tmp_path.rglob("group-*.safetensors"))
    return model, handle, files, x, ref


@pytest.mark.parametrize("cpu_read", ["mapped", "copy"])
def test_truncated_group_file_is_detected(tmp_path, cpu_read):
    model, handle, files, x, _ = _applied_on_disk(tmp_path, cpu_read)
    os.truncate(files[3], files[3].stat().st_size - 100)
    for _ in range(2):  # and stays detected: never a wrong output
        with torch.no_grad(), pytest.raises(CorruptGroupFileError, match="load the model again"):
            model(**x)
    handle._placement.store = None  # keep the evidence out of remove()'s way
    with pytest.raises(CorruptGroupFileError):
        handle.remove()


@pytest.mark.parametrize("cpu_read", ["mapped", "copy"])
def test_corrupted_group_file_is_detected_by_checksum(tmp_path, cpu_read):
    """A write after the first read (checksums already passed once) with size and mtime put
    back: the ctime moved, so that read checks the checksums again."""
    model, handle, files, x, ref = _applied_on_disk(tmp_path, cpu_read)
    target = files[2]
    flip_byte(target, keep_mtime=True)  # size and mtime look untouched
    with torch.no_grad(), pytest.raises(CorruptGroupFileError, match="checksum"):
        model(**x)
    # Put the byte back: the model works again, the failed forward left nothing behind.
    flip_byte(target, keep_mtime=True)
    with torch.no_grad():
        assert torch.equal(model(**x), ref)
    handle.remove()


def test_run_killed_mid_write_is_detected_and_rewritten(tmp_path):
    name = f"victim-{uuid.uuid4().hex[:6]}"
    code = textwrap.dedent(
        f"""
        import os, torch
        from offload_core import apply_offload, OffloadPolicy, DiskTier
        from offload_core.disk import store as diskstore
        from tests.helpers import make_model
        calls = {{"n": 0}}
        real = os.replace
        def dying_replace(a, b):
            if str(a).endswith(".safetensors.tmp"):
                calls["n"] += 1
                if calls["n"] == 3:
                    os._exit(9)  # killed between writing a group file and renaming it
            return real(a, b)
        diskstore.os.replace = dying_replace
        apply_offload(make_model("fp32"), OffloadPolicy(tier=DiskTier({str(tmp_path)!r})),
                      onload_device="cpu", name={name!r})
        """
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 9, r.stderr
    folder = tmp_path / f"ferry-{name}"
    assert any(p.name.endswith(".tmp") for p in folder.iterdir()), "the kill left a partial file"
    x, ref = reference("fp32")
    model = make_model("fp32")
    handle = apply_offload(
        model, OffloadPolicy(tier=DiskTier(str(tmp_path))), onload_device="cpu", name=name
    )
    notes = " ".join(handle.stats().notes)
    assert not any(p.name.endswith(".tmp") for p in folder.iterdir())
    with torch.no_grad():
        assert torch.equal(model(**x), ref)
    handle.remove()
    assert "earlier run" in notes
    assert not folder.exists()


def test_never_deletes_what_it_did_not_write(tmp_path):
    # A name no other test uses: a live offload elsewhere would move the name on instead.
    name = f"squat-{uuid.uuid4().hex[:6]}"
    (tmp_path / "mine.txt").write_text("user file")
    squatter = tmp_path / f"ferry-{name}"
    squatter.mkdir()
    (squatter / "group-00000.safetensors").write_text("not Ferry's")
    x, ref = reference("fp32")
    model = make_model("fp32")
    policy = OffloadPolicy(tier=DiskTier(str(tmp_path)))
    handle = apply_offload(model, policy, onload_device="cpu", name=name)
    with torch.no_grad():
        assert torch.equal(model(**x), ref)
    assert handle.stats().disk_folder == str(tmp_path / f"ferry-{name}-2"), (
        "a folder Ferry did not make is left alone"
    )
    handle.remove()
    assert (tmp_path / "mine.txt").read_text() == "user file"
    assert (squatter / "group-00000.safetensors").read_text() == "not Ferry's"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"ferry-{name}", "mine.txt"]


def test_folders_ferry_created_are_removed_when_empty(tmp_path):
    target = tmp_path / "made" / "by" / "ferry"
    model = make_model("fp32")
    handle = apply_offload(model, OffloadPolicy(tier=DiskTier(str(target))), onload_device="cpu")
    assert target.is_dir()
    handle.remove()
    assert list(tmp_path.iterdir()) == []
