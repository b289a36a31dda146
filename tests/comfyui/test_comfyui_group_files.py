"""The pre-flight and the run agree on the disk tier's group files, in real ComfyUI (issue 47).

Found in v0.33.0: UNETLoader (weight_dtype default) -> Ferry Offload Model, tier disk, in a
folder with no room: POST /ferry/plan said "fits", disk 0 B (the groups read from the file in
place), and the run failed with "disk_path: ... has 0 B free, the offloaded groups need
13.42 MiB". Now both take one answer (planner/group_files.py): the run reads the groups from
the loader's file, writing nothing, and gives the plain latent; a loader that casts is
planned as written, and the run refuses the folder as the plan said.

    FERRY_COMFYUI=/work/comfy/v0.33.0 python -m pytest tests/comfyui/test_comfyui_group_files.py
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from ferry_workflows import MODEL_FILE, Client, error_message, ferry, graph, saved_latent_name
from safetensors.torch import load_file

from tests.helpers import tmpfs


@pytest.fixture(scope="module")
def client(server: Any) -> Client:
    return Client(server.url)


def latent(server: Any, entry: dict[str, Any]) -> torch.Tensor:
    return load_file(str(server.base / "output" / saved_latent_name(entry)))["latent_tensor"]


def folder_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def test_unetloader_on_disk_is_read_in_place_as_planned(
    client: Client, server: Any, tmp_path: Path
) -> None:
    entry = client.run(graph([], "group-files-plain"))
    assert entry["status"]["status_str"] == "success", error_message(entry)
    reference = latent(server, entry)
    with tmpfs(tmp_path / "no-room", "1m") as small:
        g = graph([ferry(tier="disk", disk_path=str(small))], "group-files-unet")
        status, body = client.post("/ferry/plan", {"prompt": g})
        assert status == 200, body
        (net,) = body["networks"]
        assert net["tier"] == "disk" and net["disk_bytes"] == 0, net
        assert body["fits"], body["verdict"]
        entry = client.run(g)
        assert entry["status"]["status_str"] == "success", (
            f"{error_message(entry)}\n{server.log_tail()}"
        )
        assert torch.equal(latent(server, entry), reference)
        assert folder_bytes(small) < 64 * 1024, list(small.rglob("*"))  # no group files
        (line,) = [o for o in client.live() if o.get("tier") == "disk"]
        assert line["groups"] > 0


def test_a_cast_unetloader_on_disk_is_planned_as_written_and_refused(
    client: Client, server: Any, tmp_path: Path
) -> None:
    loader = ("UNETLoader", {"unet_name": MODEL_FILE, "weight_dtype": "fp8_e4m3fn"})
    with tmpfs(tmp_path / "no-room", "1m") as small:
        g = graph([ferry(tier="disk", disk_path=str(small))], "group-files-cast", loader=loader)
        status, body = client.post("/ferry/plan", {"prompt": g})
        assert status == 200, body
        assert body["disk_bytes"] > 0 or not body["fits"], body
        entry = client.run(g)
        assert entry["status"]["status_str"] == "error"
        message = error_message(entry)
        assert "disk_path: " in message and f"{small} has " in message, message
