"""The panel's API through gradio_client against a real server: the settings round trip
(panel -> file -> what the nodes read), rejections that name the setting, Apply, the monitor,
the planner with one-click save, and what the server refuses to expose."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("gradio")
from gradio_client import Client

from ._panel_server import RunningPanel, run_panel

# gradio's own use of pandas warns on pandas 3; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:.*:Warning:gradio")

FORM = (
    "level",
    "blocks_per_group",
    "tier",
    "disk_path",
    "prefetch_depth",
    "vram_budget",
    "headroom_gb",
    "quant",
    "direct_io",
    "verify",
    "cpu_read",
)


@pytest.fixture(scope="module")
def running(pack: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningPanel]:
    yield from run_panel(pack, tmp_path_factory.mktemp("panel-api"))


@pytest.fixture(scope="module")
def client(running: RunningPanel) -> Client:
    return Client(running.url, verbose=False)


def test_binds_loopback_and_second_launch_returns_the_same_url(running: RunningPanel) -> None:
    assert running.url.startswith("http://127.0.0.1:")
    assert running.panel.launch_panel() == running.url
    errors = running.sub("offload_core.errors")
    with pytest.raises(
        errors.ConfigError, match=r"^host: 0\.0\.0\.0 would let other machines .*allow_remote=True"
    ):
        running.panel.launch_panel("0.0.0.0")
    with pytest.raises(errors.ConfigError, match=r"^host: "):
        running.panel.launch_panel("192.168.1.10", 7860)


def test_only_the_disk_path_field_takes_a_path(client: Client) -> None:
    api = client.view_api(print_info=False, return_format="dict")
    names = set(api["named_endpoints"])
    assert names == {"/monitor", "/run_demo", "/plan_preview", "/check_disk", "/save_settings",
                     "/apply_settings", "/load_settings", "/run_planner", "/save_recommended"}  # fmt: skip
    for name, ep in api["named_endpoints"].items():
        for p in ep["parameters"]:
            label = (p.get("label") or "").lower()
            if any(w in label for w in ("path", "folder", "file", "dir")):
                assert label == "disk folder (for the disk tier)", (name, label)


def test_server_does_not_serve_local_files(running: RunningPanel) -> None:
    running.settings_path.write_text("{}")
    for target in ("/etc/passwd", str(running.settings_path)):
        for prefix in ("gradio_api/file=", "file="):
            try:
                with urllib.request.urlopen(running.url + prefix + target, timeout=10) as r:
                    body = r.read()
                    assert b"root:" not in body and body.strip() != b"{}", (prefix, target)
            except urllib.error.HTTPError as e:
                assert e.code in (403, 404), (prefix, target, e.code)
    running.settings_path.unlink()


def test_settings_round_trip_panel_file_nodes(
    running: RunningPanel, client: Client, tmp_path: Path
) -> None:
    disk = tmp_path / "swap"
    msg = client.predict(
        "block", 3, "disk", str(disk), 2, "1.5", 0.5, "int8-weight", False, "every_read", "copy",
        api_name="/save_settings",
    )  # fmt: skip
    assert msg.startswith("✔ Saved to") and str(running.settings_path) in msg
    data = json.loads(running.settings_path.read_text())
    assert data["policy"] == {
        "level": "block", "blocks_per_group": 3, "tier": "disk", "disk_path": str(disk),
        "source_checkpoint": None, "prefetch_depth": 2, "vram_budget_gb": 1.5, "headroom_gb": 0.5,
        "direct_io": False, "verify": "every_read", "cpu_read": "copy", "bake_lora": "off",
    }  # fmt: skip
    assert data["quant_preset"] == "int8-weight"
    assert not disk.exists()  # saving a disk path creates nothing
    # What the ComfyUI node reads with "use panel settings" on.
    settings_file = running.sub("offload_core.tools.settings_file")
    config = running.sub("nodes.planning.config")
    policy = config.policy_from_panel(lambda: settings_file.load_settings(running.settings_path))
    oc = running.sub("offload_core")
    assert policy == oc.OffloadPolicy(
        level=oc.BlockLevel(3), prefetch_depth=2,
        tier=oc.DiskTier(str(disk), direct_io=False, verify="every_read", cpu_read="copy"),
        vram_budget=int(1.5 * (1 << 30)), headroom_bytes=1 << 29,
    )  # fmt: skip
    # And the page reads it back into its widgets.
    values = client.predict(api_name="/load_settings")
    assert values[0] == "block" and values[1]["value"] == 3 and values[1]["maximum"] == 4
    assert list(values[2:11]) == [
        "disk", str(disk), 2, "1.5", 0.5, "int8-weight", False, "every_read", "copy",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("form", "setting"),
    [
        (("block", 2, "ram", "", 1, "lots", 2.0, "none"), "vram_budget_gb"),
        (("block", 2, "disk", "", 1, "", 2.0, "none"), "disk_path"),
        (("block", 2, "disk", "/etc/passwd", 1, "", 2.0, "none"), "disk_path"),
        (("block", 2, "ram", "", 1, "0.0001", 2.0, "none"), "vram_budget"),
    ],
)
def test_invalid_settings_are_rejected_with_the_setting_named(
    running: RunningPanel, client: Client, form: tuple[object, ...], setting: str
) -> None:
    before = running.settings_path.read_bytes() if running.settings_path.exists() else None
    msg = client.predict(*form, api_name="/save_settings")
    assert msg.startswith(f"✖ Not saved. {setting}: "), msg
    after = running.settings_path.read_bytes() if running.settings_path.exists() else None
    assert after == before


def test_widgets_refuse_values_outside_their_choices(client: Client) -> None:
    with pytest.raises(Exception, match="int3-magic is not in the list of choices"):
        client.predict("block", 2, "ram", "", 1, "", 2.0, "int3-magic", api_name="/save_settings")


def test_blocks_per_group_is_bounded_by_the_model(running: RunningPanel, client: Client) -> None:
    # The slider refuses more blocks than the model has in a row ...
    with pytest.raises(Exception, match="greater than maximum value 4"):
        client.predict("block", 5, "ram", "", 1, "", 2.0, "none", api_name="/save_settings")
    # ... and the check behind it names the setting (a caller that bypasses the slider).
    sv = running.sub("web.panel.settings_view")
    msg = sv.save(running.ctx, "block", 5, "ram", "", 1, "", 2.0, "none")
    assert msg.startswith("✖ Not saved. blocks_per_group: this model has at most 4 blocks")


def test_disk_check_endpoint(client: Client, tmp_path: Path) -> None:
    target = tmp_path / "new" / "ferry"
    assert "will be created" in client.predict(str(target), api_name="/check_disk")
    assert not (tmp_path / "new").exists()
    f = tmp_path / "f"
    f.write_text("x")
    assert (
        client.predict(str(f), api_name="/check_disk")
        == f"✖ disk_path: {f} is a file, not a folder"
    )


def test_preview_changes_with_the_block_count(client: Client) -> None:
    one = client.predict("block", 1, "ram", "", 1, "", 2.0, "none", api_name="/plan_preview")
    four = client.predict("block", 4, "ram", "", 1, "", 2.0, "none", api_name="/plan_preview")
    gpu = {r[0]: r[1] for r in one[0]["data"]}["on the GPU (at peak)"]
    gpu4 = {r[0]: r[1] for r in four[0]["data"]}["on the GPU (at peak)"]
    assert gpu4 > gpu > 0
    assert (
        "**6 groups**" in one[1] and "**2 groups**" in four[1]
    )  # 2 double + 4 single blocks: 1 + 1 group


def test_apply_reoffloads_the_demo_and_the_monitor_shows_it(
    running: RunningPanel, client: Client
) -> None:
    msg = client.predict("block", 2, "ram", "", 1, "", 2.0, "none", api_name="/apply_settings")
    assert msg.startswith("✔ demo") and "re-offloaded" in msg
    oc = running.sub("offload_core")
    handle = oc.find_offload(running.ctx.demo.model)
    assert handle.policy == oc.OffloadPolicy(level=oc.BlockLevel(2), tier=oc.RamTier())
    assert client.predict(2, api_name="/run_demo").startswith("✔ ran ")
    running.ctx.monitor.sample_now()
    _vram, ram, system, table, status, strips = client.predict(api_name="/monitor")
    assert {row[2] for row in ram["data"]} == {
        "own memory",
        "file cache (reclaimable)",
        "shared memory",
    }
    assert all(row[1] > 0 for row in system["data"])
    row = next(r for r in table["data"] if r[0] == handle.kind.line_title(handle.name))
    cells = dict(zip(running.sub("web.panel.monitor_view").OFFLOAD_COLUMNS, row, strict=True))
    assert row[1] == "ram" and row[2] == "3 (0)" and cells["forwards"] >= 1
    assert cells["why"] == ""  # the panel's Apply chose its settings: no planner sentence
    assert "samples" in status
    # Its group strip: a cell per group, in the panel's words (web/panel/strip_view.py).
    assert f"<b>{handle.kind.line_title(handle.name)}</b>" in strips and "waiting" in strips


def test_planner_recommends_and_saves_with_one_click(running: RunningPanel, client: Client) -> None:
    table, vram_pts, _ram_pts, verdict, *_ = client.predict(
        None, None, 0.002, "", api_name="/run_planner"
    )
    rows = table["data"]
    cols = table["headers"]
    assert len(rows) >= 4 and cols[:3] == ["#", "plan", "s/forward"]
    assert verdict.startswith("✔ recommended: #")
    # The same planner ComfyUI's "auto" uses, beside the measurements (a CPU: the RAM tier).
    assert "Ferry's planner (auto, not measured): ram: " in verdict and "ahead" in verdict
    idx = int(verdict.split("#")[1].split()[0])
    best = next(r for r in rows if r[0] == idx)
    assert best[2] == min(r[2] for r in rows if r[5] == "yes" and r[2] is not None)
    assert len(vram_pts["data"]) == len(rows)
    out = client.predict("none", api_name="/save_recommended")
    assert out[-1].startswith("✔ Saved the recommended plan")
    saved = running.sub("offload_core.tools.settings_file").load_settings(running.settings_path)
    assert saved.policy.to_dict()["blocks_per_group"] == int(best[1].split("x")[1].split(",")[0])


def test_planner_rejects_bad_input_before_work(client: Client) -> None:
    _, _, _, verdict, *_ = client.predict(-1, None, 0.002, "", api_name="/run_planner")
    assert verdict.startswith("✖ vram_budget_gb: ")
    assert client.predict(None, None, 0.002, "/etc/passwd", api_name="/run_planner")[3].startswith(
        "✖ disk_path: "
    )
