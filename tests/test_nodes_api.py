"""What the /ferry/ routes answer, the pushed stats, and the memory report (no ComfyUI needed)."""

from __future__ import annotations

import importlib
import json
import threading
from pathlib import Path

import pytest

from tests.conftest import PACK_NAME, load_pack

load_pack()
api = importlib.import_module(f"{PACK_NAME}.nodes.ui.api")
stats = importlib.import_module(f"{PACK_NAME}.nodes.ui.stats")
report = importlib.import_module(f"{PACK_NAME}.nodes.ui.report")
pusher = importlib.import_module(f"{PACK_NAME}.nodes.ui.pusher")
monitor = importlib.import_module(f"{PACK_NAME}.offload_core.tools.monitor")
memory = importlib.import_module(f"{PACK_NAME}.offload_core.runtime.memory")

OFFLOAD = {
    "name": "flux", "device": "cuda:0", "level": "block", "tier": "disk", "groups": 19,
    "resident_groups": 2, "prefetch_depth": 2, "forwards": 28, "group_loads": 476,
    "bytes_per_tier": {"device": 3 << 30, "pinned": 0, "ram": 0, "disk": 20 << 30},
    "bytes_h2d": 9 << 30, "bytes_disk": 9 << 30, "h2d_gbps": 21.5, "disk_gbps": 6.1,
    "transfer_s": 1.9, "stall_s": 0.25, "overlap": 0.87, "peak_vram": 5 << 30,
    "disk_folder": "/nvme/ferry-flux", "never_ran": [], "notes": ["long note"],
}  # fmt: skip


def sample(**over: object) -> object:
    base = dict(t=1.0, vram_allocated=None, vram_reserved=None, vram_device_used=None, vram_total=None,
                rss_anon=100, rss_file=200, rss_shmem=3, system_available=4000)  # fmt: skip
    base.update(over)
    return monitor.Sample(**base)


def test_stats_payload_shape_for_the_sidebar() -> None:
    p = stats.stats_payload(sample(vram_allocated=5, vram_reserved=6, vram_device_used=7, vram_total=8),
                            [monitor.OffloadSample("flux", OFFLOAD)], "cuda")  # fmt: skip
    json.dumps(p)  # the event and the route send it as JSON
    assert p["vram"] == {"allocated": 5, "reserved": 6, "device_used": 7, "total": 8}
    assert p["ram"]["rss_anon"] == 100 and p["ram"]["system_available"] == 4000
    (o,) = p["offloads"]
    assert o["tiers"] == {"device": 3 << 30, "disk": 20 << 30}  # empty tiers dropped
    assert o["bytes_moved"] == 9 << 30 and o["h2d_gbps"] == 21.5 and o["stall_s"] == 0.25
    assert "notes" not in o


def test_cpu_and_disk_bytes_count_as_moved() -> None:
    o = stats.offload_entry(
        monitor.OffloadSample("m", {**OFFLOAD, "bytes_h2d": 0, "bytes_disk": 77})
    )
    assert o["bytes_moved"] == 77
    p = stats.stats_payload(sample(), [], None)
    assert p["vram"] is None and p["offloads"] == []
    err = stats.offload_entry(monitor.OffloadSample("m", {"error": "RuntimeError: x"}))
    assert err == {"name": "m", "kind": "model", "title": "model: m", "error": "RuntimeError: x"}


def test_get_stats_reads_now_without_starting_anything() -> None:
    before = threading.active_count()
    status, body = api.get_stats()
    assert status == 200 and body["ram"]["rss_anon"] > 0 and isinstance(body["offloads"], list)
    assert threading.active_count() == before


def test_settings_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    status, body = api.get_settings(path)
    assert status == 200 and body["error"] is None and body["settings"]["quant_preset"] == "none"
    assert "int8-weight" in body["presets"]
    new = {"policy": {"level": "block", "blocks_per_group": 3, "tier": "disk", "disk_path": str(tmp_path)},
           "quant_preset": "int8-weight"}  # fmt: skip
    status, body = api.put_settings(new, path)
    assert status == 200 and Path(body["path"]) == path
    status, body = api.get_settings(path)
    assert (
        body["settings"]["policy"]["blocks_per_group"] == 3
        and body["settings"]["quant_preset"] == "int8-weight"
    )


@pytest.mark.parametrize(
    ("body", "setting"),
    [
        ([1, 2], "body"),
        ({"policy": {"tier": "tape"}}, "tier"),
        ({"policy": {"prefetch_depth": 0}}, "prefetch_depth"),
        ({"policy": {}, "quant_preset": "int3"}, "quant_preset"),
        ({"policy": {}, "colour": "red"}, "colour"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(
    body: object, setting: str, tmp_path: Path
) -> None:
    path = tmp_path / "settings.json"
    status, reply = api.put_settings(body, path)
    assert status == 400 and reply["setting"] == setting and reply["error"]
    assert not path.exists()


def test_a_broken_settings_file_is_reported_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text("{not json")
    status, body = api.get_settings(path)
    assert status == 200 and "not valid JSON" in body["error"] and body["settings"]["policy"]


def test_panel_start_validates_and_reports() -> None:
    seen = {}

    def launch(host: str, port: int | None, *, is_busy: object) -> str:
        seen.update(host=host, port=port)
        return f"http://{host}:{port or 7860}/"

    assert api.start_panel({}, launch, None) == (200, {"url": "http://127.0.0.1:7860/"})
    assert seen == {"host": "127.0.0.1", "port": None}
    assert api.start_panel({"port": 7861}, launch, None)[1]["url"].endswith(":7861/")
    assert api.start_panel(None, launch, None)[0] == 200
    for bad, field in (({"port": 0}, "port"), ({"port": "80"}, "port"), ({"port": True}, "port"),
                       ({"host": "0.0.0.0"}, "host"), ("x", "body")):  # fmt: skip
        status, body = api.start_panel(bad, launch, None)
        assert status == 400 and body["setting"] == field, bad

    def busy_port(host: str, port: int | None, *, is_busy: object) -> str:
        raise OSError("address in use")

    assert api.start_panel({"port": 7861}, busy_port, None)[0] == 409


def test_pusher_pushes_only_while_something_is_offloaded() -> None:
    sent: list[dict] = []
    pusher._state["had_offloads"] = False
    off = [monitor.OffloadSample("m", OFFLOAD)]
    assert pusher.on_tick(sample(), [], sent.append) is False
    assert pusher.on_tick(sample(), off, sent.append) is True
    assert pusher.on_tick(sample(), off, sent.append) is True
    assert pusher.on_tick(sample(), [], sent.append) is True  # once more: the sidebar sees it gone
    assert pusher.on_tick(sample(), [], sent.append) is False
    assert [len(p["offloads"]) for p in sent] == [1, 1, 0]


def test_report_text() -> None:
    proc = memory.ProcessMemory(1 << 30, 2 << 30, 0)
    dev = memory.DeviceMemory(3 << 30, 4 << 30, 5 << 30, 6 << 30, 24 << 30)
    text = report.report_text(proc, dev, "cuda", [OFFLOAD], "Ferry plan: ...")
    for needle in ("anon 1.00 GiB", "allocated 3.00 GiB", "of 24.00 GiB", "flux: block level, tier disk",
                   "disk 20.00 GiB", "21.50 GB/s", "stall 0.250 s", "Ferry plan: ..."):  # fmt: skip
        assert needle in text, needle
    cpu = report.report_text(proc, None, None, [])
    assert "no accelerator" in cpu and "none live" in cpu
