"""Real ComfyUI, real HTTP, real sampling: Ferry's nodes change where the weights wait, never
the result. Every latent is compared bit for bit with the one ComfyUI makes without Ferry."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from ferry_workflows import MODEL_FILE, Client, error_message, ferry, graph, lora, saved_latent_name
from safetensors.torch import load_file

NODES = (
    "FerryOffloadModel",
    "FerryOffloadTextEncoder",
    "FerryLoadDiffusionModelQuantized",
    "FerryMemoryReport",
)


@pytest.fixture(scope="module")
def client(server: Any) -> Client:
    return Client(server.url)


def latent(server: Any, entry: dict[str, Any]) -> torch.Tensor:
    return load_file(str(server.base / "output" / saved_latent_name(entry)))["latent_tensor"]


def run_ok(client: Client, server: Any, g: dict[str, Any]) -> torch.Tensor:
    entry = client.run(g)
    assert entry["status"]["status_str"] == "success", (
        f"{error_message(entry)}\n{server.log_tail()}"
    )
    return latent(server, entry)


@pytest.fixture(scope="module")
def reference(client: Client, server: Any) -> torch.Tensor:
    return run_ok(client, server, graph([], "plain"))


@pytest.fixture(scope="module")
def lora_reference(client: Client, server: Any) -> torch.Tensor:
    return run_ok(client, server, graph([lora()], "plain-lora"))


def live(client: Client) -> list[dict[str, Any]]:
    return client.live()


def test_pack_loaded_from_a_hyphenated_folder(server: Any) -> None:
    text = server.log.read_text(errors="replace")
    assert (
        "custom_nodes/ComfyUI-Ferry" in text and "IMPORT FAILED): " + str(server.base) not in text
    )


def test_object_info_lists_the_nodes_with_tooltips(client: Client) -> None:
    info = client.get("/object_info")
    for node in NODES:
        assert node in info, node
        spec = info[node]
        assert spec["category"] == "Ferry" and spec["description"]
        inputs = {**spec["input"].get("required", {}), **spec["input"].get("optional", {})}
        assert inputs, node
        for name, (_, opts) in inputs.items():
            assert opts.get("tooltip"), f"{node}.{name} has no tooltip"
    offload = info["FerryOffloadModel"]["input"]["required"]
    assert list(offload) == [
        "model", "use_panel_settings", "level", "blocks_per_group", "tier", "disk_path",
        "prefetch_depth", "vram_budget",
    ]  # fmt: skip
    # Optional, so a workflow saved before they existed still validates (the other tests'
    # graphs leave them out).
    assert list(info["FerryOffloadModel"]["input"]["optional"]) == [
        "headroom_gb", "direct_io", "verify", "cpu_read", "bake_lora",
    ]  # fmt: skip
    presets = info["FerryLoadDiffusionModelQuantized"]["input"]["required"]["quant_preset"][1][
        "options"
    ]
    assert presets[:2] == ["none", "int8-weight"]


@pytest.mark.parametrize("tier", ["pinned", "ram", "disk"])
@pytest.mark.parametrize("level", ["block", "leaf"])
def test_same_latent_with_ferry_in_each_tier(
    client: Client, server: Any, reference: torch.Tensor, tier: str, level: str
) -> None:
    got = run_ok(
        client, server, graph([ferry(tier=tier, level=level, prefetch_depth=2)], f"{tier}-{level}")
    )
    assert torch.equal(got, reference)
    (o,) = live(client)  # the model stays loaded, offloaded, after the prompt
    assert o["tier"] == tier and o["level"] == level
    assert o["forwards"] >= 3 and o["bytes_moved"] > 0, o
    if tier == "disk":
        assert o["disk_folder"] and Path(o["disk_folder"]).is_relative_to(server.base / "temp")


def test_plain_model_after_ferry_gets_its_weights_back(
    client: Client, server: Any, reference: torch.Tensor
) -> None:
    run_ok(client, server, graph([ferry(tier="ram")], "before-plain"))
    assert len(live(client)) == 1
    assert torch.equal(run_ok(client, server, graph([], "plain-again")), reference)
    assert live(client) == []  # a plain clone loading released Ferry's layout


def test_a_ferry_node_that_runs_again_with_the_same_config_keeps_its_layout(
    client: Client, server: Any, reference: torch.Tensor
) -> None:
    # The node runs again (its panel settings file saved anew, unchanged), so ComfyUI drops its
    # old MODEL and collects it before the new one loads: the layout stays (patcher.py, the
    # anchor), and a plain load after it still gets the plain weights back.
    settings = {"policy": {"tier": "ram", "level": "block", "prefetch_depth": 1}}
    assert client.post("/ferry/settings", settings)[0] == 200
    run_ok(client, server, graph([ferry(use_panel_settings=True)], "again", seed=21))
    laid = server.log.read_text(errors="replace").count("ferry: laid out")
    time.sleep(0.05)  # a new mtime for the same settings: the node's fingerprint changes
    assert client.post("/ferry/settings", settings)[0] == 200
    got = run_ok(client, server, graph([ferry(use_panel_settings=True)], "again"))
    assert torch.equal(got, reference)
    assert server.log.read_text(errors="replace").count("ferry: laid out") == laid
    assert torch.equal(run_ok(client, server, graph([], "plain-after-again")), reference)
    assert live(client) == []


def test_lora_after_ferry_gives_the_same_latent(
    client: Client, server: Any, reference: torch.Tensor, lora_reference: torch.Tensor
) -> None:
    assert not torch.equal(lora_reference, reference)  # the LoRA does change the result
    for tier in ("ram", "disk"):
        got = run_ok(client, server, graph([ferry(tier=tier), lora()], f"{tier}-lora"))
        assert torch.equal(got, lora_reference), tier
        assert live(client)[0]["tier"] == tier  # the LoRA's clone() kept the offload
    # LoRA first, then Ferry: the patches come with the clone and are laid out baked in.
    assert torch.equal(
        run_ok(client, server, graph([lora(), ferry(tier="pinned")], "lora-first")), lora_reference
    )
    # Back to no LoRA through the same Ferry node: the patches are undone exactly.
    assert torch.equal(
        run_ok(client, server, graph([ferry(tier="disk")], "disk-nolora")), reference
    )


def test_a_node_that_drops_ferry_is_said_once_by_name(
    client: Client, server: Any, reference: torch.Tensor
) -> None:
    """A node whose patcher is not Ferry's any more: the run is right and plain, and the log
    says so, naming the node (patcher.py, [Note: a hold that says when it is lost])."""
    g = graph([ferry(tier="ram"), ("FerryTestPlainClone", {})], "dropped", seed=31)
    assert torch.equal(run_ok(client, server, g), reference_for(client, server, 31))
    log = server.log.read_text(errors="replace")
    assert "node 11 (FerryTestPlainClone) replaced the model's patcher" in log, server.log_tail()
    assert "WITHOUT Ferry" in log
    run_ok(client, server, graph([ferry(tier="ram"), ("FerryTestPlainClone", {})], "d2", seed=32))
    assert server.log.read_text(errors="replace").count("WITHOUT Ferry") == 1, "said once"


def reference_for(client: Client, server: Any, seed: int) -> torch.Tensor:
    return run_ok(client, server, graph([], f"plain-{seed}", seed=seed))


def test_unloading_models_releases_ferry(client: Client, server: Any) -> None:
    run_ok(client, server, graph([ferry(tier="pinned")], "to-free"))
    assert len(live(client)) == 1
    client.unload_models(within_s=5)


def test_comfyui_accounting_sees_ferrys_device_bytes(client: Client, server: Any) -> None:
    g = graph([ferry(tier="ram", blocks_per_group=1)], "report")
    g["7"] = {"class_type": "FerryMemoryReport", "inputs": {"after": ["5", 0], "model": ["10", 0]}}
    entry = client.run(g)
    assert entry["status"]["status_str"] == "success", error_message(entry)
    text = entry["outputs"]["7"]["text"][0]
    (o,) = live(client)
    device_bytes = o["tiers"]["device"]
    loaded = int(text.split("ComfyUI accounting: loaded ")[1].split(" ")[0])
    size = int(text.split("model_size ")[1].split(" ")[0])
    # ComfyUI's manager counts what Ferry holds on the device (+ the tiny non-network parts),
    # not the whole model, and believes it fully loaded (nothing for it to move).
    assert device_bytes <= loaded < device_bytes + (1 << 20)
    assert loaded == size
    assert "Ferry memory report" in text and "tier ram" in text


def test_bad_inputs_are_node_errors_and_the_next_prompt_runs(
    client: Client, server: Any, reference: torch.Tensor
) -> None:
    status, body = client.queue(graph([ferry(vram_budget="lots")], "bad"))
    assert status == 400
    errors = body["node_errors"]["10"]
    assert errors["class_type"] == "FerryOffloadModel"
    assert all("vram_budget:" in e["details"] for e in errors["errors"])

    a_file = server.base / "not-a-folder"
    a_file.write_text("x")
    status, body = client.queue(graph([ferry(tier="disk", disk_path=str(a_file))], "bad"))
    assert status == 400 and "disk_path:" in json.dumps(body["node_errors"])

    entry = client.run(graph([ferry(blocks_per_group=99)], "bad"))
    assert entry["status"]["status_str"] == "error"
    msg = error_message(entry)
    assert msg.startswith("FerryOffloadModel: blocks_per_group:") and "between 1 and 3" in msg

    status, body = client.queue(
        graph(
            [],
            "bad",
            loader=(
                "FerryLoadDiffusionModelQuantized",
                {"unet_name": MODEL_FILE, "quant_preset": "float8-dynamic", "cache": False},
            ),
        )
    )
    assert status == 400 and "quant_preset:" in json.dumps(body["node_errors"])

    assert torch.equal(
        run_ok(client, server, graph([ferry(tier="disk")], "good-after-bad")), reference
    )


def test_panel_settings_switch(client: Client, server: Any, reference: torch.Tensor) -> None:
    status, body = client.post("/ferry/settings", {"policy": {"tier": "ram", "prefetch_depth": 0}})
    assert status == 400 and body["setting"] == "prefetch_depth"
    status, body = client.post(
        "/ferry/settings",
        {
            "policy": {
                "tier": "disk",
                "disk_path": str(server.base / "panel-disk"),
                "level": "leaf",
            },
            "quant_preset": "none",
        },
    )
    assert status == 200, body
    assert client.get("/ferry/settings")["settings"]["policy"]["level"] == "leaf"
    got = run_ok(client, server, graph([ferry(use_panel_settings=True, tier="pinned")], "panel"))
    assert torch.equal(got, reference)
    (o,) = live(client)
    assert (o["tier"], o["level"]) == ("disk", "leaf")
    # The same graph again after the panel saved other settings: the node runs again.
    status, _ = client.post("/ferry/settings", {"policy": {"tier": "ram", "prefetch_depth": 2}})
    assert status == 200
    got = run_ok(client, server, graph([ferry(use_panel_settings=True, tier="pinned")], "panel"))
    assert torch.equal(got, reference)
    (o,) = live(client)
    assert (o["tier"], o["level"], o["prefetch_depth"]) == ("ram", "block", 2)


def test_quantized_loader_then_ferry_matches_the_quantized_model(
    client: Client, server: Any, reference: torch.Tensor
) -> None:
    q = (
        "FerryLoadDiffusionModelQuantized",
        {"unet_name": MODEL_FILE, "quant_preset": "int8-weight", "cache": True},
    )
    quantized = run_ok(client, server, graph([], "q", loader=q))
    assert not torch.equal(quantized, reference) and torch.isfinite(quantized).all()
    assert any((server.base / "models" / "ferry-cache").iterdir())
    for tier in ("ram", "disk"):
        assert torch.equal(
            run_ok(client, server, graph([ferry(tier=tier)], f"q-{tier}", loader=q)), quantized
        )
    none = (
        "FerryLoadDiffusionModelQuantized",
        {"unet_name": MODEL_FILE, "quant_preset": "none", "cache": False},
    )
    # Unquantized through Ferry's loader, disk tier: the groups are read from the model's file,
    # so Ferry writes no group files of its own.
    assert torch.equal(
        run_ok(client, server, graph([ferry(tier="disk")], "none-disk", loader=none)), reference
    )
    (o,) = live(client)
    assert o["bytes_disk"] > 0
    assert [f.name for f in Path(o["disk_folder"]).iterdir() if f.stat().st_size > 4096] == []


def test_stats_route_and_panel_route_validate(client: Client) -> None:
    body = client.get("/api/ferry/stats")  # ComfyUI also serves every route under /api
    assert body["ram"]["rss_anon"] > 0
    status, body = client.post("/ferry/panel", {"port": "x"})
    # The body is checked before the route looks for gradio: a bad port is a 400 either way.
    assert (status, body.get("setting")) == (400, "port"), body
