"""Ferry behind core's loaders on the disk tier (issue 48): the groups that are still the
loaded file's bytes are read from that file in place, and only the groups a LoRA changed are
written into Ferry's folder:

    UNETLoader [-> LoraLoaderModelOnly] -> Ferry Offload Model (disk) -> KSampler
    CLIPLoader -> Ferry Offload Text Encoder (disk) -> CLIPTextEncode

Core keeps no path on the model, so the node finds the file from the prompt's loader inputs
(nodes/planning/loader_files.py); the disk tier compares each group's bytes with the file's
before it reads the group from it (offload_core/sources/origin.py). Every output is
``torch.equal`` to the plain graph's.

    FERRY_COMFYUI=/work/comfy/v0.33.0 python -m pytest tests/comfyui/test_comfyui_in_place.py
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import Server, comfy_checkout, make_base, run_maker, start_server, stop_server
from ferry_workflows import MODEL_FILE, Client, error_message, ferry, graph, lora, saved_latent_name
from safetensors.torch import load_file
from test_comfyui_text_encoder import T5, clip_graph, encode, ferry_te

GROUP_FILES = "group-*.safetensors"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    comfy, py = comfy_checkout()
    base = tmp_path_factory.mktemp("comfy-in-place")
    make_base(base, py, comfy)
    run_maker(base, py, comfy, "make_text_encoders.py")
    srv = start_server(comfy, py, base)
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture(scope="module")
def client(server: Server) -> Client:
    return Client(server.url)


FP8 = "ferry-tiny-sd3-fp8scaled.safetensors"  # make_tiny_models.py: core's fp8_scaled format
UNET_FP8 = ("UNETLoader", {"unet_name": FP8, "weight_dtype": "default"})


@pytest.fixture(scope="module")
def plain(client: Client, server: Server) -> dict[str, torch.Tensor]:
    """Every plain output, made before any Ferry layout: a plain graph run after a disk
    layout was given back failed on v0.33 ("Inference tensors do not track version
    counter", the report says more); this file tests what Ferry reads and writes."""
    out = {
        "unet": run_latent(client, server, graph([], "plain-unet", seed=30)),
        "lora": run_latent(client, server, graph([lora()], "plain-lora", seed=31)),
        "fp8": run_latent(client, server, graph([], "plain-fp8", loader=UNET_FP8, seed=32)),
    }
    loader = ("CLIPLoader", {"clip_name": T5, "type": "sd3"})
    te = encode(client, server, clip_graph(*loader, "t5-plain-in-place"))
    out.update({f"t5:{k}": v for k, v in te.items()})
    return out


def run_latent(client: Client, srv: Server, g: dict[str, Any]) -> torch.Tensor:
    entry = client.run(g)
    assert entry["status"]["status_str"] == "success", f"{error_message(entry)}\n{srv.log_tail()}"
    return load_file(str(srv.base / "output" / saved_latent_name(entry)))["latent_tensor"]


def folder_of(client: Client, name_part: str) -> Path:
    """The disk folder of the live layout whose name holds ``name_part``."""
    (o,) = [o for o in client.live() if name_part in o["name"] and o["tier"] == "disk"]
    return Path(o["disk_folder"])


def only_the_marker(folder: Path) -> bool:
    """Ferry's folder holds its marker and nothing else (the disk speed it measured may sit
    beside it)."""
    return {p.name for p in folder.iterdir()} - {".ferry-disk-speed.json"} == {".ferry-owned"}


def log_text(srv: Server) -> str:
    return srv.log.read_text(errors="replace")


# First of the graphs through Ferry: a LoRA patches core's cached MODEL as core loaded it. After
# a disk layout of that MODEL was given back, a LoRA run failed on v0.33 ("Inference tensors do
# not track version counter"; the report of issue 48 says more).
def test_lora_before_ferry_writes_only_the_groups_it_changed(
    client: Client, server: Server, plain: dict[str, torch.Tensor]
) -> None:
    disk = server.base / "temp" / "ferry-disk-lora"
    chain = [lora(), ferry(tier="disk", disk_path=str(disk))]
    got = run_latent(client, server, graph(chain, "disk-lora", seed=31))
    assert torch.equal(got, plain["lora"])
    written = sorted(p.name for p in folder_of(client, "MMDIT").glob(GROUP_FILES))
    # The tiny LoRA changes joint blocks 0 and 1 of three (make_tiny_models.py): one group
    # each at block level; the third block and the rest are read from the file.
    assert written == ["group-00000.safetensors", "group-00001.safetensors"], written
    assert "streamed groups (nothing written for them); 2 written" in log_text(server)
    client.unload_models(within_s=60)


@pytest.mark.parametrize("level", ["block", "leaf"])
def test_unet_loader_then_disk_tier_writes_no_group_file(
    client: Client, server: Server, plain: dict[str, torch.Tensor], level: str
) -> None:
    disk = server.base / "temp" / f"ferry-disk-{level}"
    got = run_latent(
        client,
        server,
        graph([ferry(tier="disk", level=level, disk_path=str(disk))], f"disk-{level}", seed=30),
    )
    assert torch.equal(got, plain["unet"])
    folder = folder_of(client, "MMDIT")
    assert folder.is_relative_to(disk)
    assert only_the_marker(folder)
    model = server.base / "models" / "diffusion_models" / MODEL_FILE
    assert f"ferry: read in place from {model}" in log_text(server)
    client.unload_models(within_s=60)


def test_clip_loader_then_disk_tier_writes_no_group_file(
    client: Client, server: Server, plain: dict[str, torch.Tensor]
) -> None:
    loader = ("CLIPLoader", {"clip_name": T5, "type": "sd3"})
    disk = server.base / "temp" / "ferry-disk-te"
    ferry_inputs = ferry_te(tier="disk", disk_path=str(disk))
    got = encode(client, server, clip_graph(*loader, "t5-disk-in-place", ferry_inputs))
    want = {k.removeprefix("t5:"): v for k, v in plain.items() if k.startswith("t5:")}
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[k], want[k]) for k in want)
    folder = folder_of(client, "t5xxl")
    assert only_the_marker(folder)
    path = server.base / "models" / "text_encoders" / T5
    assert f"ferry: read in place from {path}" in log_text(server)
    client.unload_models(within_s=60)


@pytest.mark.parametrize("level", ["block", "leaf"])
def test_fp8_scaled_file_is_read_in_place_behind_either_loader(
    client: Client, server: Server, plain: dict[str, torch.Tensor], level: str
) -> None:
    """Its stored fp8 weights and their scales are read from the file: behind UNETLoader
    (core's QuantizedTensor: its data and its scale compared with the file's) and behind
    Ferry's own loader (built on meta from the file)."""
    unet = UNET_FP8
    ours = (
        "FerryLoadDiffusionModelQuantized",
        {"unet_name": FP8, "quant_preset": "none", "cache": False, "weight_dtype": "default"},
    )
    for name, loader in (("unet", unet), ("ferry", ours)):
        disk = server.base / "temp" / f"ferry-disk-fp8-{name}-{level}"
        chain = [ferry(tier="disk", level=level, disk_path=str(disk))]
        got = run_latent(
            client, server, graph(chain, f"fp8-{name}-{level}", loader=loader, seed=32)
        )
        assert torch.equal(got, plain["fp8"]), name
        # While the layout is live (its group files are deleted when it is given back).
        assert list(disk.rglob(GROUP_FILES)) == [], name
        client.unload_models(within_s=60)
    path = server.base / "models" / "diffusion_models" / FP8
    assert f"ferry: read in place from {path}: " in log_text(server)
