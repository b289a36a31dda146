"""The panel's logic without a server: the disk-folder check, the form <-> settings mapping,
Apply's re-offload, and importing the panel without gradio."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def panel_pkg(pack: ModuleType) -> ModuleType:
    return importlib.import_module(f"{pack.__name__}.web.panel")


def sub(pack: ModuleType, name: str) -> ModuleType:
    return importlib.import_module(f"{pack.__name__}.{name}")


def test_importing_the_panel_imports_no_gradio_and_starts_nothing() -> None:
    code = (
        "import sys, threading; sys.path.insert(0, 'tests'); import conftest;"
        "p = conftest.load_pack(); import importlib;"
        "importlib.import_module(p.__name__ + '.web.panel');"
        "print('gradio' in sys.modules, 'comfy' in sys.modules, threading.active_count(),"
        " __import__('torch').cuda.is_initialized())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "False", "1", "False"]


def test_disk_check_reacts_and_never_creates_anything(pack: ModuleType, tmp_path: Path) -> None:
    check = sub(pack, "web.panel.disk_check").check_disk_path
    new = tmp_path / "a" / "b"
    r = check(str(new), 1 << 20)
    assert r.ok and "will be created" in r.message and "need 1.00 MiB" in r.message
    assert not (tmp_path / "a").exists()
    r = check(str(tmp_path), 1 << 20)
    assert r.ok and "exists and is writable" in r.message
    f = tmp_path / "file.bin"
    f.write_bytes(b"x")
    r = check(str(f), None)
    assert not r.ok and r.message == f"{f} is a file, not a folder"
    assert (
        sub(pack, "web.panel.disk_check").markdown(r) == f"✖ disk_path: {f} is a file, not a folder"
    )
    r = check(str(f / "below"), None)
    assert not r.ok and "cannot be created" in r.message
    r = check("relative/dir", None)
    assert not r.ok and "full path" in r.message
    r = check("", None)
    assert not r.ok and r.message.startswith("type a folder")
    r = check(str(tmp_path), 1 << 60)  # an exabyte: no disk has that free
    assert not r.ok and "the offloaded groups need" in r.message and "GiB free" in r.message
    r = check("/tmp/\x00bad", None)
    assert not r.ok and "not a usable path" in r.message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.bin"]


def test_disk_check_read_only_folder(
    pack: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = sub(pack, "web.panel.disk_check")
    # CI often runs as root, who may write anywhere: make access() answer as for a user.
    # (test_settings_parsers.py also checks a real read-only mount.)
    folder = sub(pack, "offload_core.disk.folder")
    monkeypatch.setattr(folder.os, "access", lambda p, mode: Path(p) != tmp_path)
    r = mod.check_disk_path(str(tmp_path / "ferry"), None)
    assert (
        not r.ok
        and r.message == f"{tmp_path / 'ferry'} cannot be created ({tmp_path} is not writable)"
    )
    r = mod.check_disk_path(str(tmp_path), None)
    assert not r.ok and r.message == f"{tmp_path} is not writable"


def test_form_round_trip_and_errors_name_the_setting(pack: ModuleType) -> None:
    forms = sub(pack, "web.panel.forms")
    errors = sub(pack, "offload_core.errors")
    s = forms.settings_from_form("block", 3.0, "disk", " /tmp/x ", 2.0, "6", 1.5, "int8-weight")
    d = s.policy.to_dict()
    assert (d["blocks_per_group"], d["tier"], d["disk_path"], d["prefetch_depth"]) == (
        3,
        "disk",
        "/tmp/x",
        2,
    )
    assert (
        d["vram_budget_gb"] == 6.0 and d["headroom_gb"] == 1.5 and s.quant_preset == "int8-weight"
    )
    assert forms.settings_from_form(*forms.form_from_settings(s)) == s
    assert (
        forms.settings_from_form("leaf", 1, "ram", "", 1, "auto", 2, "none").policy.vram_budget
        == "auto"
    )
    for values, setting in [
        (("block", 2.5, "ram", "", 1, "", 2, "none"), "blocks_per_group"),
        (("block", 1, "ram", "", 9, "", 2, "none"), "prefetch_depth"),
        (("block", 1, "ram", "", 1, "lots", 2, "none"), "vram_budget_gb"),
        (("block", 1, "disk", "", 1, "", 2, "none"), "disk_path"),
        (("block", 1, "ram", "", 1, "", -1, "none"), "headroom_gb"),
        (("block", 1, "ram", "", 1, "", 2, "int2"), "quant_preset"),
        (("slices", 1, "ram", "", 1, "", 2, "none"), "level"),
    ]:
        with pytest.raises(errors.ConfigError) as e:
            forms.settings_from_form(*values)
        assert e.value.setting == setting, values


def test_apply_reoffloads_live_models_between_runs(pack: ModuleType, tmp_path: Path) -> None:
    oc = sub(pack, "offload_core")
    ctx_mod = sub(pack, "web.panel.context")
    from offload_core.tools.monitor import Monitor  # a private monitor: nothing shared is started

    demo = ctx_mod.DemoSession(size_gb=0.002, tokens=8)
    ctx = ctx_mod.PanelContext(settings_path=tmp_path / "s.json", demo=demo, onload_device="cpu",
                               monitor=Monitor(read_offloads=lambda: []))  # fmt: skip
    first = oc.OffloadPolicy(level=oc.BlockLevel(1), tier=oc.RamTier())
    ctx.start_demo(sub(pack, "offload_core.tools.settings_file").PanelSettings(first))
    model = demo.model
    with torch.inference_mode():
        ref = model(**demo.inputs)
    try:
        assert oc.find_offload(model).policy == first
        assert ctx.max_blocks() == 4  # the twin plans while the real model is offloaded
        new = oc.OffloadPolicy(level=oc.BlockLevel(4), tier=oc.DiskTier(str(tmp_path / "swap")))
        lines = ctx.reapply(new)
        assert lines == [f"{oc.find_offload(model).name}: re-offloaded"]
        assert oc.find_offload(model).policy == new
        with torch.inference_mode():
            assert torch.equal(model(**demo.inputs), ref)
        # Busy: the host says a job runs -> refused, nothing changed.
        ctx.is_busy = lambda: True
        with pytest.raises(oc.ConfigError, match=r"^apply: a job is running"):
            ctx.reapply(first)
        assert oc.find_offload(model).policy == new
        ctx.is_busy = lambda: False
        with ctx.run_lock, pytest.raises(oc.ConfigError, match=r"^apply: busy"):
            ctx.reapply(first)
    finally:
        h = oc.find_offload(model)
        if h is not None:
            h.remove()
    assert not any((tmp_path / "swap").rglob("*")) if (tmp_path / "swap").exists() else True


def test_demo_runs_resident_when_the_saved_settings_cannot_apply(
    pack: ModuleType, tmp_path: Path
) -> None:
    oc = sub(pack, "offload_core")
    ctx_mod = sub(pack, "web.panel.context")
    from offload_core.tools.monitor import Monitor

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    demo = ctx_mod.DemoSession(size_gb=0.002, tokens=8)
    ctx = ctx_mod.PanelContext(settings_path=tmp_path / "s.json", demo=demo, onload_device="cpu",
                               monitor=Monitor(read_offloads=lambda: []))  # fmt: skip
    saved = sub(pack, "offload_core.tools.settings_file").PanelSettings(
        oc.OffloadPolicy(tier=oc.DiskTier(str(blocker / "swap")))
    )
    msg = ctx.start_demo(saved)
    assert msg.startswith("demo model runs without offload: disk_path"), msg
    assert oc.find_offload(demo.model) is None
    assert ctx.run_demo(0.01).startswith("ran ")
    assert blocker.read_text() == "not a folder"
