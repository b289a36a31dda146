"""The offload node's widgets -> policy: every bad value fails naming the widget to change."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from tests.conftest import PACK_NAME, load_pack
from tests.helpers import tmpfs

load_pack()
config = importlib.import_module(f"{PACK_NAME}.nodes.planning.config")
oc = importlib.import_module(f"{PACK_NAME}.offload_core")

GOOD = dict(
    level="block", blocks_per_group=2, tier="ram", disk_path="", prefetch_depth=2, vram_budget=""
)


def widget_error(**over: object) -> str:
    with pytest.raises(config.NodeInputError) as info:
        config.policy_from_inputs(**{**GOOD, **over})
    return info.value.input_name


def test_good_widgets_make_the_policy() -> None:
    p = config.policy_from_inputs(**GOOD)
    assert p.to_dict()["blocks_per_group"] == 2
    assert p.tier_name == "ram" and p.prefetch_depth == 2 and p.vram_budget is None


@pytest.mark.parametrize("tier", ["pinned", "ram", "shared"])
def test_each_tier_widget_makes_its_tier(tier: str) -> None:
    assert config.policy_from_inputs(**{**GOOD, "tier": tier}).tier_name == tier


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("auto", "auto"),
        (" AUTO ", "auto"),
        ("", None),
        ("none", None),
        ("0", None),
        ("6", 6 << 30),
        ("7.5 GB", int(7.5 * (1 << 30))),  # typed before the labels said GiB: the same bytes
        ("7.5 GiB", int(7.5 * (1 << 30))),
    ],
)
def test_vram_budget_forms(text: str, want: object) -> None:
    assert config.policy_from_inputs(**{**GOOD, "vram_budget": text}).vram_budget == want


def test_advanced_widgets_reach_the_disk_tier(tmp_path: Path) -> None:
    p = config.policy_from_inputs(
        **{**GOOD, "tier": "disk", "disk_path": str(tmp_path)},
        headroom_gb=0.5, direct_io=False, verify="every_read", cpu_read="copy",
    )  # fmt: skip
    assert p.tier == oc.DiskTier(
        str(tmp_path), direct_io=False, verify="every_read", cpu_read="copy"
    )
    assert p.headroom_bytes == 1 << 29
    # Without them (a workflow saved before they existed): the defaults.
    assert config.policy_from_inputs(
        **{**GOOD, "tier": "disk", "disk_path": str(tmp_path)}
    ).tier == (oc.DiskTier(str(tmp_path)))


@pytest.mark.parametrize(
    ("over", "widget"),
    [
        ({"blocks_per_group": 0}, "blocks_per_group"),
        ({"prefetch_depth": 9}, "prefetch_depth"),
        ({"level": "layer"}, "level"),
        ({"tier": "nvme"}, "tier"),
        ({"tier": "disk", "disk_path": "  "}, "disk_path"),
        ({"vram_budget": "lots"}, "vram_budget"),
        ({"vram_budget": "-2"}, "vram_budget"),
        ({"vram_budget": "nan"}, "vram_budget"),
        ({"tier": "disk", "disk_path": "/tmp/x", "verify": "sometimes"}, "verify"),
        ({"tier": "disk", "disk_path": "/tmp/x", "cpu_read": "mmap"}, "cpu_read"),
        ({"headroom_gb": -1.0}, "headroom_gb"),
    ],
)
def test_each_bad_widget_is_named(over: dict, widget: str) -> None:
    assert widget_error(**over) == widget


def test_disk_tier_uses_the_default_folder_when_empty(tmp_path: Path) -> None:
    p = config.policy_from_inputs(**{**GOOD, "tier": "disk"}, default_disk_path=str(tmp_path))
    assert p.tier.path == str(tmp_path)


def test_engine_setting_names_map_to_widgets() -> None:
    err = oc.ConfigError("vram_budget_gb", "must be > 0 GB")
    e = config.as_node_error(err)
    assert e.input_name == "vram_budget" and str(e) == "vram_budget: must be > 0 GB"
    e = config.as_node_error(oc.GroupingError("blocks_per_group", "is 9 but ... has 3 blocks"))
    assert e.input_name == "blocks_per_group"


def test_panel_settings_errors_name_the_switch() -> None:
    def broken() -> object:
        raise oc.ConfigError("tier", "must be 'pinned', 'ram' or 'disk', got 'x'")

    with pytest.raises(config.NodeInputError) as info:
        config.policy_from_panel(broken)
    assert info.value.input_name == "use_panel_settings"
    assert "'tier'" in str(info.value) and "panel" in str(info.value)


def test_panel_settings_are_used_when_valid() -> None:
    class Saved:
        policy = oc.OffloadPolicy(tier=oc.RamTier(), prefetch_depth=3)

    assert config.policy_from_panel(lambda: Saved()).prefetch_depth == 3


def test_disk_folder_checks(tmp_path: Path) -> None:
    a_file = tmp_path / "f"
    a_file.write_text("x")
    for bad in ("", "relative/path", str(a_file), str(a_file / "below")):
        with pytest.raises(config.NodeInputError) as info:
            config.check_disk_folder(bad)
        assert info.value.input_name == "disk_path"
    # A folder that does not exist yet is fine (Ferry creates it), and nothing is created now.
    new = tmp_path / "a" / "b"
    assert config.check_disk_folder(str(new)) == new
    assert not (tmp_path / "a").exists()
    with pytest.raises(config.NodeInputError, match="free, the offloaded groups need"):
        config.check_disk_folder(str(tmp_path), need_bytes=1 << 60)


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere: the mount case runs")
def test_read_only_folder_is_refused(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(config.NodeInputError, match="not writable"):
            config.check_disk_folder(str(ro / "x"))
    finally:
        ro.chmod(0o700)


def test_read_only_mount_is_refused_even_to_root(tmp_path: Path) -> None:
    # Root (as CI runs) writes through a folder's mode bits, not onto a read-only mount.
    with tmpfs(tmp_path / "ro", "1m", readonly=True) as ro:
        for path in (ro, ro / "x"):
            with pytest.raises(config.NodeInputError, match="not writable") as info:
                config.check_disk_folder(str(path))
            assert info.value.input_name == "disk_path"


def test_source_checkpoint_only_for_the_disk_tier(tmp_path: Path) -> None:
    ram = config.ComfyOffload(config.policy_from_inputs(**GOOD))
    assert ram.with_source_checkpoint("/m.safetensors") == ram
    disk = config.ComfyOffload(
        config.policy_from_inputs(**{**GOOD, "tier": "disk", "disk_path": str(tmp_path)})
    )
    source = tmp_path / "m.safetensors"  # the source must be a file (seam/offload.py)
    source.write_bytes(b"")
    assert disk.with_source_checkpoint(str(source)).policy.tier.source_checkpoint == str(source)
    assert disk.with_source_checkpoint(None) == disk


@pytest.mark.parametrize(
    ("widgets", "bad"),
    [
        ({"tier": "auto", "disk_path": "relative/folder"}, None),  # auto: the plan's folder
        ({"tier": "disk", "disk_path": "relative/folder"}, "disk_path"),
        ({"tier": "auto", "vram_budget": "lots"}, "vram_budget"),
        ({"tier": "auto", "blocks_per_group": "0"}, "blocks_per_group"),
        ({"tier": "auto", "level": "branch"}, "level"),
        ({"tier": "fast"}, "tier"),
    ],
)
def test_the_widgets_parse_once_and_say_nothing_of_auto(
    widgets: dict[str, object], bad: str | None
) -> None:
    # What validate_inputs and execute both run: no stand-in for an "auto" setting.
    if bad is None:
        s = config.NodeSettings.parse(widgets)
        assert s.auto and s.wish.tier is None and s.disk_path == "relative/folder"
        return
    with pytest.raises(config.NodeInputError) as e:
        config.NodeSettings.parse(widgets)
    assert e.value.input_name == bad


def test_the_vram_cap_replaces_only_auto() -> None:
    set_all = {"tier": "ram", "blocks_per_group": "1", "prefetch_depth": "1"}
    auto = config.NodeSettings.parse({**set_all, "vram_budget": "auto"})
    assert auto.policy(vram_cap=oc.units.GIB).vram_budget == oc.units.GIB
    assert auto.policy().vram_budget == "auto"
    fixed = config.NodeSettings.parse({**set_all, "vram_budget": "6"})
    assert fixed.policy(vram_cap=oc.units.GIB).vram_budget == 6 * oc.units.GIB
