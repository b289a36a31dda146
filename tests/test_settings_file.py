"""The settings file: what the panel saves is exactly what the nodes read; bad files fail
with a message naming the setting; writes are atomic and never leave stray files."""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from offload_core import (
    BlockLevel,
    ConfigError,
    DiskTier,
    LeafLevel,
    OffloadPolicy,
    PinnedRamTier,
    RamTier,
)
from offload_core.tools.settings_file import (
    PanelSettings,
    default_settings_path,
    load_settings,
    save_settings,
)


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    s = PanelSettings(
        OffloadPolicy(
            level=BlockLevel(3), tier=DiskTier(str(tmp_path / "swap")), prefetch_depth=2,
            vram_budget=6 << 30, headroom_bytes=1 << 30,
        ),
        quant_preset="int8-weight",
    )  # fmt: skip
    path = save_settings(s, tmp_path / "settings.json")
    assert load_settings(path) == s
    data = json.loads(path.read_text())
    assert data["policy"]["blocks_per_group"] == 3 and data["policy"]["tier"] == "disk"
    assert data["policy"]["vram_budget_gb"] == 6.0 and data["quant_preset"] == "int8-weight"


def every_policy(folder: str) -> list[OffloadPolicy]:
    """Policies that between them give every field of OffloadPolicy and DiskTier a value other
    than its default, with byte counts that are not round numbers of GB."""
    disk = DiskTier(folder)
    disks = [
        disk,
        DiskTier(folder, source_checkpoint="/models/m.safetensors"),
        DiskTier(folder, direct_io=False),
        DiskTier(folder, verify="every_read"),
        DiskTier(folder, cpu_read="copy"),
        DiskTier(folder, "/m.safetensors", direct_io=False, verify="every_read", cpu_read="copy"),
    ]
    return [
        OffloadPolicy(),
        OffloadPolicy(level=LeafLevel(), tier=RamTier()),
        OffloadPolicy(level=BlockLevel(7), tier=PinnedRamTier(), prefetch_depth=8),
        OffloadPolicy(vram_budget="auto", headroom_bytes=123_456_789),
        OffloadPolicy(vram_budget=7_838_315_725, headroom_bytes=0),
        OffloadPolicy(tier=RamTier(), bake_lora="auto"),
        OffloadPolicy(bake_lora="on"),
        *(OffloadPolicy(tier=t, prefetch_depth=3, vram_budget=1) for t in disks),
    ]


def test_the_round_trip_policies_vary_every_field(tmp_path: Path) -> None:
    # A field added later without a value here fails this test, not silently the round trip.
    policies = every_policy(str(tmp_path))
    for cls, values in [
        (OffloadPolicy, policies),
        (DiskTier, [p.tier for p in policies if isinstance(p.tier, DiskTier)]),
    ]:
        # A field outside the policy's equality (planned_vram: the planner's share, per
        # prompt) is never saved, so it has no round trip to vary.
        default = {f.name: f.default for f in fields(cls) if f.default is not MISSING and f.compare}
        for name, value in default.items():
            assert any(getattr(v, name) != value for v in values), f"{cls.__name__}.{name}"


def test_every_policy_round_trips_through_the_file(tmp_path: Path) -> None:
    p = tmp_path / "s.json"
    for policy in every_policy(str(tmp_path / "swap")):
        save_settings(PanelSettings(policy), p)
        assert load_settings(p).policy == policy
        assert OffloadPolicy.from_dict(policy.to_dict()) == policy


def test_missing_file_gives_defaults(tmp_path: Path) -> None:
    assert load_settings(tmp_path / "nothing.json") == PanelSettings()


@pytest.mark.parametrize(
    ("content", "setting"),
    [
        ({"policy": {"blocks_per_group": 0}}, "blocks_per_group"),
        ({"policy": {"tier": "tape"}}, "tier"),
        ({"policy": {"tier": "disk"}}, "disk_path"),
        ({"policy": {"prefetch_depth": 99}}, "prefetch_depth"),
        ({"policy": {"vram_budget_gb": "lots"}}, "vram_budget_gb"),
        ({"policy": {"blocks_per_grup": 2}}, "blocks_per_grup"),
        ({"quant_preset": "int3-magic"}, "quant_preset"),
        ({"ferry_settings": 99}, "ferry_settings"),
        ({"colour": "blue"}, "colour"),
        ([1, 2], "settings_file"),
    ],
)
def test_invalid_file_names_the_setting(tmp_path: Path, content: object, setting: str) -> None:
    p = tmp_path / "s.json"
    p.write_text(json.dumps(content))
    with pytest.raises(ConfigError) as e:
        load_settings(p)
    assert e.value.setting == setting
    assert str(e.value).startswith(f"{setting}: ")


def test_invalid_json_names_the_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "s.json"
    p.write_text('{\n  "policy": {,}\n}')
    with pytest.raises(ConfigError, match=r"settings_file: .*s\.json is not valid JSON \(line 2"):
        load_settings(p)


def test_invalid_settings_are_not_written(tmp_path: Path) -> None:
    p = tmp_path / "s.json"
    with pytest.raises(ConfigError, match=r"^quant_preset: "):
        save_settings(PanelSettings(quant_preset="bogus"), p)
    with pytest.raises(ConfigError, match=r"^blocks_per_group: "):
        save_settings(PanelSettings(OffloadPolicy(level=BlockLevel(0))), p)
    assert list(tmp_path.iterdir()) == []


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path: Path) -> None:
    p = tmp_path / "deep" / "er" / "s.json"
    save_settings(PanelSettings(OffloadPolicy(level=BlockLevel(2))), p)
    first_inode = p.stat().st_ino
    save_settings(PanelSettings(OffloadPolicy(level=BlockLevel(4))), p)
    # os.replace swaps in a new file: a reader holding the old one never sees a half write.
    assert p.stat().st_ino != first_inode
    assert load_settings(p).policy.level == BlockLevel(4)
    assert sorted(x.name for x in p.parent.iterdir()) == ["s.json"]


def test_failed_write_removes_only_its_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "s.json"
    (tmp_path / "keep.txt").write_text("not Ferry's")

    def boom(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        save_settings(PanelSettings(), p)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["keep.txt"]


def test_default_path_env_override_and_per_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FERRY_SETTINGS", str(tmp_path / "mine.json"))
    assert default_settings_path() == tmp_path / "mine.json"
    save_settings(PanelSettings(OffloadPolicy(level=BlockLevel(5))))
    assert load_settings().policy.level == BlockLevel(5)
    monkeypatch.delenv("FERRY_SETTINGS")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    if os.name == "posix" and os.uname().sysname == "Linux":
        assert default_settings_path() == tmp_path / "cfg" / "ferry" / "settings.json"
